package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/store"
)

// batching is a flaky store that is also a store.Batch, counting its
// AllowEach calls; each request goes through flaky's Allow.
type batching struct {
	*flaky
	batches int
}

func (b *batching) AllowEach(ctx context.Context, reqs []store.Request, out []store.Result, errs []error) {
	b.mu.Lock()
	b.batches++
	b.mu.Unlock()
	for i, r := range reqs {
		out[i], errs[i] = b.Allow(ctx, r.Key, r.Cost, r.Policy)
	}
}

func eachReqs() []store.Request {
	p, q := store.Policy{Rate: 1, Burst: 3}, store.Policy{Rate: 1, Burst: 1}
	return []store.Request{
		{Key: "a", Cost: 2, Policy: p}, {Key: "b", Cost: 1, Policy: q},
		{Key: "a", Cost: 2, Policy: p}, {Key: "b", Cost: 1, Policy: q}, {Key: "a", Cost: 1, Policy: p},
	}
}

// store.AllowEach answers as Allow one after another, on a Batch in one
// call and on any other store by Allow in turn; a Breaker passes a batch
// through when its store is a Batch and loops otherwise.
func TestAllowEachAsAllowInTurn(t *testing.T) {
	now := time.Hour
	clock := func() time.Duration { return now }
	want := func() ([]store.Result, []error) {
		m := store.NewMemory(store.WithClock(clock))
		defer m.Close()
		reqs := eachReqs()
		out, errs := make([]store.Result, len(reqs)), make([]error, len(reqs))
		for i, r := range reqs {
			out[i], errs[i] = m.Allow(context.Background(), r.Key, r.Cost, r.Policy)
		}
		return out, errs
	}
	wantOut, wantErrs := want()
	require.Equal(t, []bool{true, true, false, false, true},
		[]bool{wantOut[0].Allowed, wantOut[1].Allowed, wantOut[2].Allowed, wantOut[3].Allowed, wantOut[4].Allowed})

	cases := map[string]func() (store.Store, *batching){
		"memory": func() (store.Store, *batching) { return store.NewMemory(store.WithClock(clock)), nil },
		"batch": func() (store.Store, *batching) {
			b := &batching{flaky: &flaky{Store: store.NewMemory(store.WithClock(clock))}}
			return b, b
		},
		"breaker/batch": func() (store.Store, *batching) {
			b := &batching{flaky: &flaky{Store: store.NewMemory(store.WithClock(clock))}}
			return store.NewBreaker(b, store.BreakerOptions{}), b
		},
		"breaker/memory": func() (store.Store, *batching) {
			return store.NewBreaker(store.NewMemory(store.WithClock(clock)), store.BreakerOptions{}), nil
		},
	}
	for name, open := range cases {
		t.Run(name, func(t *testing.T) {
			s, b := open()
			defer s.Close()
			reqs := eachReqs()
			out, errs := make([]store.Result, len(reqs)), make([]error, len(reqs))
			store.AllowEach(context.Background(), s, reqs, out, errs)
			assert.Equal(t, wantOut, out)
			assert.Equal(t, wantErrs, errs)
			if b != nil {
				assert.Equal(t, 1, b.batches, "one call for the lot")
			}
		})
	}
}

// Through a Breaker each request of a batch counts as its own Allow: three
// failed requests in one batch open a breaker that trips at three, and an
// open breaker answers every request of the next batch with the fault,
// without asking the store.
func TestBreakerAllowEachCountsEachRequest(t *testing.T) {
	for _, batch := range []bool{true, false} {
		t.Run(map[bool]string{true: "batch", false: "loop"}[batch], func(t *testing.T) {
			f := &flaky{Store: store.NewMemory()}
			var s store.Store = f
			if batch {
				s = &batching{flaky: f}
			}
			br := store.NewBreaker(s, store.BreakerOptions{Trip: 3, ProbeEvery: time.Hour})
			defer br.Close()
			reqs := eachReqs()[:3]
			out, errs := make([]store.Result, 3), make([]error, 3)
			f.set(true)
			br.AllowEach(context.Background(), reqs, out, errs)
			for _, err := range errs {
				require.ErrorIs(t, err, errRefused)
			}
			require.ErrorIs(t, br.Fault(), store.ErrDown, "open after 3 failures in a row")
			before, _ := f.calls()
			br.AllowEach(context.Background(), reqs, out, errs)
			for _, err := range errs {
				require.ErrorIs(t, err, store.ErrDown)
			}
			after, _ := f.calls()
			assert.Equal(t, before, after, "an open breaker does not call the store")
		})
	}
}
