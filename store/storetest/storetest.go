// Package storetest is the conformance suite every store.Store must pass. It
// runs against real time (a store such as Redis reads its own clock), so each
// check either uses a policy slow enough that test time is negligible, or
// asserts a bound that holds however long the test takes.
package storetest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/store"
)

var seq atomic.Int64

// key returns a key no earlier test used, so suites may share one store.
func key(t *testing.T) string {
	return fmt.Sprintf("conf-%s-%d-%d", t.Name(), time.Now().UnixNano(), seq.Add(1))
}

// slow refills one token an hour: test time is negligible against it.
func slow(burst int64) store.Policy {
	return store.Policy{Name: "slow", Rate: 1.0 / 3600, Burst: burst}
}

// Run runs the suite. open returns a fresh store (or one shared by the
// subtests; keys never repeat); the suite closes nothing but what it opens in
// the Close subtest.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := context.Background()

	t.Run("AllOrNothing", func(t *testing.T) { allOrNothing(t, open(t)) })

	t.Run("FreshKeyIsFullThenDrains", func(t *testing.T) {
		s := open(t)
		k := key(t)
		p := slow(5)
		for i := int64(1); i <= 5; i++ {
			r, err := s.Allow(ctx, k, 1, p)
			require.NoError(t, err)
			require.True(t, r.Allowed, "request %d of a full bucket of 5", i)
			assert.InDelta(t, float64(5-i), r.Remaining, 0.01)
			assert.Zero(t, r.RetryAfter)
			assert.InDelta(t, float64(i)*3600, r.ResetAfter.Seconds(), 1)
		}
		r, err := s.Allow(ctx, k, 1, p)
		require.NoError(t, err)
		assert.False(t, r.Allowed, "6th request of a burst of 5 at 1/h")
		assert.InDelta(t, 3600, r.RetryAfter.Seconds(), 1)
		assert.InDelta(t, 0, r.Remaining, 0.01)
		assert.InDelta(t, 5*3600, r.ResetAfter.Seconds(), 1)
	})

	t.Run("DenialWritesNothing", func(t *testing.T) {
		s := open(t)
		k := key(t)
		p := slow(3)
		for range 3 {
			r, err := s.Allow(ctx, k, 1, p)
			require.NoError(t, err)
			require.True(t, r.Allowed)
		}
		var first time.Duration
		for i := range 20 {
			r, err := s.Allow(ctx, k, 1, p)
			require.NoError(t, err)
			require.False(t, r.Allowed)
			if i == 0 {
				first = r.RetryAfter
			}
			// Were denials charged, the wait would grow by an hour each time.
			assert.LessOrEqual(t, r.RetryAfter, first)
		}
	})

	t.Run("CostN", func(t *testing.T) {
		s := open(t)
		k := key(t)
		p := slow(10)
		r, err := s.Allow(ctx, k, 7, p)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		assert.InDelta(t, 3, r.Remaining, 0.01)
		r, err = s.Allow(ctx, k, 4, p)
		require.NoError(t, err)
		assert.False(t, r.Allowed, "4 of 3 remaining")
		assert.InDelta(t, 3600, r.RetryAfter.Seconds(), 1, "one more token is an hour away")
		r, err = s.Allow(ctx, k, 3, p)
		require.NoError(t, err)
		assert.True(t, r.Allowed, "the denial of 4 must not have spent the 3")
		assert.InDelta(t, 0, r.Remaining, 0.01)
	})

	t.Run("CostAboveBurstIsRefused", func(t *testing.T) {
		s := open(t)
		_, err := s.Allow(ctx, key(t), 6, slow(5))
		require.ErrorIs(t, err, store.ErrCostExceedsBurst)
		_, err = s.Allow(ctx, key(t), 0, slow(5))
		require.Error(t, err)
	})

	t.Run("KeysAreIndependent", func(t *testing.T) {
		s := open(t)
		a, b := key(t), key(t)
		p := slow(2)
		for range 2 {
			r, err := s.Allow(ctx, a, 1, p)
			require.NoError(t, err)
			require.True(t, r.Allowed)
		}
		r, err := s.Allow(ctx, a, 1, p)
		require.NoError(t, err)
		require.False(t, r.Allowed)
		r, err = s.Allow(ctx, b, 2, p)
		require.NoError(t, err)
		assert.True(t, r.Allowed, "draining one key must leave another full")
	})

	t.Run("ConcurrentSpendIsExact", func(t *testing.T) {
		s := open(t)
		k := key(t)
		p := slow(37)
		var allowed atomic.Int64
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 25 {
					r, err := s.Allow(ctx, k, 1, p)
					if !assert.NoError(t, err) {
						return
					}
					if r.Allowed {
						allowed.Add(1)
					}
				}
			})
		}
		wg.Wait()
		assert.Equal(t, int64(37), allowed.Load(), "200 racing requests on a burst of 37 at 1/h")
	})

	t.Run("RefillHoldsRateBound", func(t *testing.T) {
		s := open(t)
		k := key(t)
		p := store.Policy{Name: "fast", Rate: 200, Burst: 5}
		start := time.Now()
		var allowed, denied int64
		for time.Since(start) < 250*time.Millisecond {
			r, err := s.Allow(ctx, k, 1, p)
			require.NoError(t, err)
			if r.Allowed {
				allowed++
			} else {
				denied++
				assert.Positive(t, r.RetryAfter)
				assert.LessOrEqual(t, r.RetryAfter, p.Interval())
			}
		}
		elapsed := time.Since(start)
		// The store's clock started after our start and stopped before our
		// end, so its window is inside ours: the bound holds exactly.
		bound := p.Burst + int64(elapsed/p.Interval()) + 1
		assert.LessOrEqual(t, allowed, bound, "allowed over %v", elapsed)
		assert.Greater(t, allowed, p.Burst, "the bucket refilled at 200/s over %v", elapsed)
		assert.Positive(t, denied)
	})

	t.Run("PoliciesAreIndependentPerKey", func(t *testing.T) {
		s := open(t)
		a, b := key(t), key(t)
		r, err := s.Allow(ctx, a, 1, slow(1))
		require.NoError(t, err)
		require.True(t, r.Allowed)
		r, err = s.Allow(ctx, b, 10, slow(10))
		require.NoError(t, err)
		require.True(t, r.Allowed)
		r, err = s.Allow(ctx, a, 1, slow(1))
		require.NoError(t, err)
		assert.False(t, r.Allowed)
	})

	t.Run("PingAndKeys", func(t *testing.T) {
		s := open(t)
		require.NoError(t, s.Ping(ctx))
		_, err := s.Allow(ctx, key(t), 1, slow(3))
		require.NoError(t, err)
		n, err := s.Keys(ctx)
		require.NoError(t, err)
		assert.GreaterOrEqual(t, n, int64(1))
		assert.NotEmpty(t, s.Name())
	})
}

// allOrNothing checks store.AllOrNothing, which every store implements: a
// request over the limit on one bucket spends nothing on the others.
func allOrNothing(t *testing.T, s store.Store) {
	ctx := context.Background()
	a, ok := s.(store.AllOrNothing)
	require.True(t, ok, "%T does not implement store.AllOrNothing", s)
	p5, p2 := slow(5), slow(2)
	k1, k2, k3 := key(t), key(t), key(t)
	out := make([]store.Result, 3)
	reqs := []store.Request{{Key: k1, Cost: 1, Policy: p5}, {Key: k2, Cost: 1, Policy: p2}, {Key: k3, Cost: 1, Policy: p5}}

	spent, err := a.DecideAll(ctx, reqs, true, out)
	require.NoError(t, err)
	require.True(t, spent, "every bucket full")
	for i, want := range []float64{4, 1, 4} {
		assert.True(t, out[i].Allowed, "request %d", i)
		assert.InDelta(t, want, out[i].Remaining, 0.01, "request %d", i)
	}
	spent, err = a.DecideAll(ctx, reqs, true, out)
	require.NoError(t, err)
	require.True(t, spent, "k2 has one token left")
	assert.InDelta(t, 0, out[1].Remaining, 0.01)

	// k2 is empty: the request is over the limit there and spends nothing
	// on k1 and k3, which report what they hold.
	spent, err = a.DecideAll(ctx, reqs, true, out)
	require.NoError(t, err)
	require.False(t, spent)
	assert.True(t, out[0].Allowed, "k1 would pass")
	assert.InDelta(t, 3, out[0].Remaining, 0.01, "k1 as it stands: nothing spent")
	assert.False(t, out[1].Allowed)
	assert.InDelta(t, 3600, out[1].RetryAfter.Seconds(), 1)
	assert.True(t, out[2].Allowed)
	assert.InDelta(t, 3, out[2].Remaining, 0.01, "k3 as it stands")
	for _, k := range []string{k1, k3} {
		r, err := s.Allow(ctx, k, 1, p5)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		assert.InDelta(t, 2, r.Remaining, 0.01, "the denied DecideAll spent nothing on %s", k)
	}

	// Only looking spends nothing, even when all would pass.
	k4 := key(t)
	look := []store.Request{{Key: k4, Cost: 3, Policy: p5}}
	spent, err = a.DecideAll(ctx, look, false, out)
	require.NoError(t, err)
	assert.False(t, spent)
	assert.True(t, out[0].Allowed)
	assert.InDelta(t, 5, out[0].Remaining, 0.01)
	r, err := s.Allow(ctx, k4, 5, p5)
	require.NoError(t, err)
	assert.True(t, r.Allowed, "the look left k4 full")

	// One key twice: the second request counts the first.
	k5 := key(t)
	twice := []store.Request{{Key: k5, Cost: 1, Policy: p2}, {Key: k5, Cost: 2, Policy: p2}}
	spent, err = a.DecideAll(ctx, twice, true, out)
	require.NoError(t, err)
	assert.False(t, spent, "1 + 2 tokens of a bucket of 2")
	assert.True(t, out[0].Allowed)
	assert.False(t, out[1].Allowed)
	r, err = s.Allow(ctx, k5, 2, p2)
	require.NoError(t, err)
	assert.True(t, r.Allowed, "nothing was spent on k5")

	_, err = a.DecideAll(ctx, []store.Request{{Key: key(t), Cost: 3, Policy: p2}}, true, out)
	assert.ErrorIs(t, err, store.ErrCostExceedsBurst)
}
