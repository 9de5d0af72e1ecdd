package ratelimiter_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/ratelimiter"
	"github.com/sluice-go/sluice/sched"
)

// The case of a cancelled big waiter: rate 10/s, burst 1, the bucket
// emptied at 0. A waits for 3 tokens and collects one at 100 ms and one at
// 200 ms; three callers of 1 queue behind it; A's ctx ends at 250 ms. A
// held 2 tokens and half of the next: 2.5 tokens, of which a bucket of
// burst 1 holds 1. So the callers behind get 1 at once and then one every
// 100 ms from there; the other 1.5 are dropped. Handing all of them on
// granted two at 250 ms (2 tokens at once with a burst of 1) and three
// within [250 ms, 300 ms], where the bound allows 1.5.
const (
	bigRate   = 10
	bigBurst  = 1
	bigCancel = 250 * time.Millisecond
)

var bigWant = []time.Duration{250 * ms, 350 * ms, 450 * ms}

// checkWindows fails the test unless no two of the grants (one token
// each, at the given instants, in order) share an instant and every
// window [s, e] between two of them holds at most burst + rate·(e−s).
func checkWindows(t *testing.T, at []time.Duration, rate float64, burst int) {
	t.Helper()
	for i := range at {
		for j := i + 1; j < len(at); j++ {
			assert.NotEqual(t, at[i], at[j], "grants %d and %d at the same instant", i, j)
			if limit := float64(burst) + rate*(at[j]-at[i]).Seconds(); float64(j-i+1) > limit {
				assert.Failf(t, "window bound broken", "%d tokens granted in [%v, %v], at most %v allowed",
					j-i+1, at[i], at[j], limit)
			}
		}
	}
}

// TestCancelledBigWaiterFibers: the case on fibers under virtual time.
func TestCancelledBigWaiterFibers(t *testing.T) {
	run(t, func(ctx context.Context) error {
		l := newLimiter(t, ctx, bigRate, bigBurst)
		require.True(t, l.TryAcquire(1))
		actx, cancelA := context.WithCancel(ctx)
		a := sched.Go(ctx, func(context.Context) error { return l.Acquire(actx, 3) })
		var at []time.Duration
		var behind []*sched.Fiber
		for range 3 {
			behind = append(behind, sched.Go(ctx, func(ctx context.Context) error {
				err := l.Acquire(ctx, 1)
				at = append(at, since(ctx))
				return err
			}))
		}
		require.NoError(t, sched.Sleep(ctx, bigCancel))
		require.Equal(t, 4, l.Waiters())
		cancelA()
		require.ErrorIs(t, a.Wait(ctx), context.Canceled)
		for _, f := range behind {
			require.NoError(t, f.Wait(ctx))
		}
		checkWindows(t, at, bigRate, bigBurst)
		assert.Equal(t, bigWant, at)
		assert.InDelta(t, 1.5, ratelimiter.Dropped(l), 1e-9, "tokens the bucket could not hold")
		return nil
	})
}

// TestCancelledBigWaiterGoroutines: the case on goroutines, on a
// clock.Mock moved by hand. Each grant is stamped with the mock's time,
// and time moves on only once every grant made so far has been stamped.
func TestCancelledBigWaiterGoroutines(t *testing.T) {
	mock := clock.NewMock()
	start := mock.Now()
	l, err := ratelimiter.New(context.Background(), bigRate, bigBurst, ratelimiter.WithClock(mock))
	require.NoError(t, err)
	require.True(t, l.TryAcquire(1))
	actx, cancelA := context.WithCancel(context.Background())
	defer cancelA()
	aerr := make(chan error, 1)
	go func() { aerr <- l.Acquire(actx, 3) }()
	waitFor(t, "A to park", func() bool { return l.Waiters() == 1 })
	grants := make(chan time.Duration, 3)
	for i := range 3 {
		go func() {
			assert.NoError(t, l.Acquire(context.Background(), 1))
			grants <- mock.Now().Sub(start)
		}()
		waitFor(t, "a caller to park", func() bool { return l.Waiters() == 2+i })
	}
	// Every grant made so far has been stamped: those that left the queue.
	settled := func() bool { return len(grants) == 3-l.Waiters() }
	mock.Add(bigCancel)
	cancelA()
	require.ErrorIs(t, <-aerr, context.Canceled)
	waitFor(t, "the first grant", func() bool { return len(grants) >= 1 && settled() })
	for k := 2; k <= 3 && len(grants) < 3; k++ {
		mock.Add(100 * time.Millisecond)
		waitFor(t, "the next grant", func() bool { return len(grants) >= k && settled() })
	}
	var at []time.Duration
	for range 3 {
		at = append(at, <-grants)
	}
	checkWindows(t, at, bigRate, bigBurst)
	assert.Equal(t, bigWant, at)
	assert.InDelta(t, 1.5, ratelimiter.Dropped(l), 1e-9)
}

// TestCancelledBigWaiterSynctest: the case on goroutines in a
// testing/synctest bubble, on the bubble's fake time.
func TestCancelledBigWaiterSynctest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		l, err := ratelimiter.New(context.Background(), bigRate, bigBurst)
		require.NoError(t, err)
		require.True(t, l.TryAcquire(1))
		actx, cancelA := context.WithCancel(context.Background())
		defer cancelA()
		aerr := make(chan error, 1)
		go func() { aerr <- l.Acquire(actx, 3) }()
		synctest.Wait()
		grants := make(chan time.Duration, 3)
		for range 3 {
			go func() {
				assert.NoError(t, l.Acquire(context.Background(), 1))
				grants <- time.Since(start)
			}()
			synctest.Wait() // parked, in this order
		}
		time.Sleep(bigCancel)
		require.Equal(t, 4, l.Waiters())
		cancelA()
		require.ErrorIs(t, <-aerr, context.Canceled)
		var at []time.Duration
		for range 3 {
			at = append(at, <-grants)
		}
		checkWindows(t, at, bigRate, bigBurst)
		assert.Equal(t, bigWant, at)
		assert.InDelta(t, 1.5, ratelimiter.Dropped(l), 1e-9)
	})
}

// TestStopCapsTheHeadsCollection: a limiter stopped while a head of
// n > burst holds 2.5 tokens keeps a full bucket of 1 and drops the rest,
// so what it held is accounted for: 1 in the bucket, 1.5 dropped.
func TestStopCapsTheHeadsCollection(t *testing.T) {
	run(t, func(ctx context.Context) error {
		l := newLimiter(t, ctx, bigRate, bigBurst)
		require.True(t, l.TryAcquire(1))
		a := sched.Go(ctx, func(ctx context.Context) error { return l.Acquire(ctx, 3) })
		require.NoError(t, sched.Sleep(ctx, bigCancel))
		require.True(t, l.Stop())
		require.ErrorIs(t, a.Wait(ctx), ratelimiter.ErrStopped)
		assert.Equal(t, 1.0, l.Tokens())
		assert.InDelta(t, 1.5, ratelimiter.Dropped(l), 1e-9)
		return nil
	})
}
