package decide_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/decide"
	"github.com/sluice-go/sluice/store"
)

var (
	errDown = errors.New("down")
	discard = slog.New(slog.DiscardHandler)
)

// keyed fails the requests on key "bad" and allows the others; as a batch
// it counts its calls and whether they had a deadline.
type keyed struct {
	fakeStore
	calls int
}

func (k *keyed) Allow(ctx context.Context, key string, _ int64, _ store.Policy) (store.Result, error) {
	_, k.hadDeadline = ctx.Deadline()
	if key == "bad" {
		return store.Result{}, errDown
	}
	return store.Result{Allowed: true, Remaining: 1}, nil
}

type keyedBatch struct{ keyed }

func (k *keyedBatch) AllowEach(ctx context.Context, reqs []store.Request, out []store.Result, errs []error) {
	k.calls++
	for i, r := range reqs {
		out[i], errs[i] = k.Allow(ctx, r.Key, r.Cost, r.Policy)
	}
}

// DecideEach gives each request the Decision Allow one after another would
// give it, the outage's edges on the same requests (one Failing, one
// Recovered), in one store call when the store is a Batch (under a Breaker
// too) and one Allow after another otherwise, bounded by the timeout.
func TestDecideEachAsAllowInTurn(t *testing.T) {
	keys := []string{"k", "bad", "bad", "k", "k"}
	reqs := make([]store.Request, len(keys))
	for i, k := range keys {
		reqs[i] = store.Request{Key: k, Cost: 1, Policy: p}
	}
	for _, name := range []string{"batch", "breaker", "loop"} {
		t.Run(name, func(t *testing.T) {
			kb := &keyedBatch{}
			var s store.Store = kb
			switch name {
			case "breaker":
				b := store.NewBreaker(kb, store.BreakerOptions{Trip: 100})
				defer b.Close()
				s = b
			case "loop":
				s = &kb.keyed
			}
			var edges []error
			g := decide.New(decide.Config{Store: s, Timeout: time.Second, Fail: store.FailClosed, Timed: true,
				Log: discard, OnOutage: func(err error) { edges = append(edges, err) }})
			assert.Equal(t, name != "loop", g.Batches())

			want := make([]decide.Decision, len(reqs))
			wg := decide.New(decide.Config{Store: &keyed{}, Fail: store.FailClosed, Log: discard})
			for i, r := range reqs {
				wg.Allow(context.Background(), r.Key, r.Cost, r.Policy, &want[i])
			}

			d := make([]decide.Decision, len(reqs))
			g.DecideEach(context.Background(), reqs, d, make([]store.Result, len(reqs)), make([]error, len(reqs)))
			lat := d[0].Latency
			for i := range d {
				assert.Equal(t, lat, d[i].Latency, "request %d: the one call's", i)
				d[i].Latency = 0
				assert.ErrorIs(t, d[i].Err, want[i].Err, "request %d", i)
				d[i].Err, want[i].Err = nil, nil
			}
			assert.Equal(t, want, d)
			assert.Equal(t, []decide.Outcome{decide.Decided, decide.Degraded, decide.Degraded, decide.Decided, decide.Decided},
				[]decide.Outcome{d[0].Outcome, d[1].Outcome, d[2].Outcome, d[3].Outcome, d[4].Outcome})
			assert.Equal(t, []decide.Change{decide.Steady, decide.Failing, decide.Steady, decide.Recovered, decide.Steady},
				[]decide.Change{d[0].Change, d[1].Change, d[2].Change, d[3].Change, d[4].Change})
			assert.Len(t, edges, 2)
			assert.True(t, kb.hadDeadline, "bounded by the timeout")
			if name != "loop" {
				assert.Equal(t, 1, kb.calls)
			}
		})
	}
}

// A caller gone before the answer makes every request Gone, and the
// outage state stays as it was.
func TestDecideEachGone(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	g := decide.New(decide.Config{Store: &keyedBatch{}, Log: discard})
	reqs := []store.Request{{Key: "bad", Cost: 1, Policy: p}, {Key: "k", Cost: 1, Policy: p}}
	d := make([]decide.Decision, 2)
	g.DecideEach(ctx, reqs, d, make([]store.Result, 2), make([]error, 2))
	require.Equal(t, decide.Gone, d[0].Outcome)
	assert.Equal(t, decide.Steady, d[0].Change)
	assert.Equal(t, decide.Decided, d[1].Outcome, "answered: the store decided it")
}
