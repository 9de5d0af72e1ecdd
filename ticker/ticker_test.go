package ticker_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/sched"
	"github.com/sluice-go/sluice/ticker"
	"github.com/sluice-go/sluice/vclock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const ms = time.Millisecond

func run(t *testing.T, main func(ctx context.Context) error) {
	t.Helper()
	require.NoError(t, sched.Run(context.Background(), main, sched.Virtual(time.Time{})))
}

func since(ctx context.Context) time.Duration { return sched.Now(ctx).Sub(vclock.Epoch()) }

func newTicker(t *testing.T, ctx context.Context, period time.Duration) *ticker.Ticker {
	t.Helper()
	tk, err := ticker.New(ctx, period)
	require.NoError(t, err)
	return tk
}

// next calls Next and returns the boundary as an offset from the epoch.
func next(t *testing.T, ctx context.Context, tk *ticker.Ticker) time.Duration {
	t.Helper()
	at, err := tk.Next(ctx)
	require.NoError(t, err)
	return at.Sub(vclock.Epoch())
}

// TestNoDrift: work of 30ms between ticks does not shift the grid: every
// boundary is start + k·period, and the fiber wakes exactly on it.
func TestNoDrift(t *testing.T) {
	run(t, func(ctx context.Context) error {
		tk := newTicker(t, ctx, 100*ms)
		var got, woke []time.Duration
		for range 5 {
			got = append(got, next(t, ctx, tk))
			woke = append(woke, since(ctx))
			require.NoError(t, sched.Sleep(ctx, 30*ms)) // the work
		}
		want := []time.Duration{100 * ms, 200 * ms, 300 * ms, 400 * ms, 500 * ms}
		assert.Equal(t, want, got)
		assert.Equal(t, want, woke)
		assert.Equal(t, ticker.Stats{Fired: 5, Consumed: 5}, tk.Stats())
		return nil
	})
}

// TestLateWaitSkips: a caller that comes back after several boundaries gets
// the newest at once; the older ones count as skipped, and
// Fired == Skipped + Consumed + Pending throughout.
func TestLateWaitSkips(t *testing.T) {
	run(t, func(ctx context.Context) error {
		tk := newTicker(t, ctx, 100*ms)
		assert.Equal(t, 100*ms, next(t, ctx, tk))
		require.NoError(t, sched.Sleep(ctx, 350*ms)) // now at 450ms
		assert.Equal(t, ticker.Stats{Fired: 4, Skipped: 2, Consumed: 1, Pending: 1}, tk.Stats())
		assert.Equal(t, 400*ms, next(t, ctx, tk), "the newest passed boundary, at once")
		assert.Equal(t, 450*ms, since(ctx))
		assert.Equal(t, ticker.Stats{Fired: 4, Skipped: 2, Consumed: 2}, tk.Stats())
		assert.Equal(t, 500*ms, next(t, ctx, tk), "back on the grid")
		s := tk.Stats()
		assert.Equal(t, s.Fired, s.Skipped+s.Consumed+s.Pending)
		return nil
	})
}

// TestIdleTickerArmsNothing: a ticker nobody waits on arms no timer, and an
// unstopped ticker does not hold its run open; a waiter arms exactly one.
func TestIdleTickerArmsNothing(t *testing.T) {
	vc := vclock.New(time.Time{})
	var tk *ticker.Ticker
	err := sched.Run(context.Background(), func(ctx context.Context) error {
		tk = newTicker(t, ctx, time.Second)
		assert.Equal(t, 0, vc.Pending(), "idle: no timer")
		f := sched.Go(ctx, func(ctx context.Context) error { _, err := tk.Next(ctx); return err })
		sched.Yield(ctx)
		assert.Equal(t, 1, vc.Pending(), "one waiter: one timer")
		require.NoError(t, f.Wait(ctx))
		assert.Equal(t, 0, vc.Pending(), "served: no timer left")
		return nil // no Stop: the run ends anyway
	}, sched.WithVirtualClock(vc))
	require.NoError(t, err)
	assert.Equal(t, vclock.Epoch().Add(time.Second), vc.Now())
	_, err = tk.Next(context.Background())
	assert.ErrorIs(t, err, ticker.ErrStopped, "the run's end stopped it")
}

// TestWaitersShareFIFO: with several callers waiting, each boundary goes to
// one of them, in the order they called.
func TestWaitersShareFIFO(t *testing.T) {
	run(t, func(ctx context.Context) error {
		tk := newTicker(t, ctx, 10*ms)
		var got []string
		for i := range 3 {
			sched.Go(ctx, func(ctx context.Context) error {
				at, err := tk.Next(ctx)
				got = append(got, fmt.Sprintf("%d@%v", i, at.Sub(vclock.Epoch())))
				return err
			})
		}
		require.NoError(t, sched.Sleep(ctx, time.Second))
		assert.Equal(t, []string{"0@10ms", "1@20ms", "2@30ms"}, got)
		return nil
	})
}

// TestCancelledNextConsumesNothing: a Next that times out returns the ctx's
// error at its exact deadline and leaves the boundary for the next caller.
func TestCancelledNextConsumesNothing(t *testing.T) {
	run(t, func(ctx context.Context) error {
		tk := newTicker(t, ctx, 100*ms)
		tctx, cancel := sched.WithTimeout(ctx, 40*ms)
		defer cancel()
		_, err := tk.Next(tctx)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, 40*ms, since(ctx))
		assert.Equal(t, 0, tk.Waiters())
		assert.Equal(t, 100*ms, next(t, ctx, tk))
		assert.Equal(t, ticker.Stats{Fired: 1, Consumed: 1}, tk.Stats())
		return nil
	})
}

func TestStopReleasesWaiters(t *testing.T) {
	run(t, func(ctx context.Context) error {
		tk := newTicker(t, ctx, time.Minute)
		f := sched.Go(ctx, func(ctx context.Context) error { _, err := tk.Next(ctx); return err })
		require.NoError(t, sched.Sleep(ctx, time.Second))
		assert.True(t, tk.Stop())
		assert.False(t, tk.Stop())
		assert.ErrorIs(t, f.Wait(ctx), ticker.ErrStopped)
		assert.Equal(t, time.Second, since(ctx))
		_, err := tk.Next(ctx)
		assert.ErrorIs(t, err, ticker.ErrStopped)
		return nil
	})
}

func TestReset(t *testing.T) {
	run(t, func(ctx context.Context) error {
		tk := newTicker(t, ctx, 100*ms)
		assert.Equal(t, 100*ms, next(t, ctx, tk))
		require.NoError(t, sched.Sleep(ctx, 250*ms)) // 350ms: boundaries 200, 300 passed
		tk.Reset(time.Second)
		assert.Equal(t, time.Second, tk.Period())
		assert.Equal(t, 1350*ms, next(t, ctx, tk), "the new grid starts at the Reset")
		assert.Equal(t, ticker.Stats{Fired: 4, Skipped: 2, Consumed: 2}, tk.Stats())
		assert.Panics(t, func() { tk.Reset(0) })
		return nil
	})
}

func TestInvalidPeriod(t *testing.T) {
	for _, p := range []time.Duration{0, -time.Second} {
		_, err := ticker.New(context.Background(), p)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "period "+p.String())
	}
	_, err := ticker.New(context.Background(), time.Second, ticker.WithClock(nil))
	assert.Error(t, err)
}

// TestGoroutineModeMockClock: outside any loop a clock.Mock drives the
// ticker; Next blocks the goroutine until mock.Add reaches the boundary.
func TestGoroutineModeMockClock(t *testing.T) {
	mock := clock.NewMock()
	start := mock.Now()
	tk, err := ticker.New(context.Background(), time.Second, ticker.WithClock(mock))
	require.NoError(t, err)
	got := make(chan time.Time, 1)
	go func() {
		at, err := tk.Next(context.Background())
		if err == nil {
			got <- at
		}
	}()
	for tk.Waiters() == 0 {
		runtime.Gosched()
	}
	mock.Add(999 * ms)
	assert.Equal(t, 1, tk.Waiters())
	mock.Add(ms)
	assert.Equal(t, start.Add(time.Second), <-got)
	mock.Add(2500 * ms) // 3.5s: boundaries 2 and 3 passed
	at, err := tk.Next(context.Background())
	require.NoError(t, err)
	assert.Equal(t, start.Add(3*time.Second), at)
	assert.True(t, tk.Stop())
}

// TestRealClock: on real time the boundaries are still exact grid points
// (the wake is late, the value is not).
func TestRealClock(t *testing.T) {
	t0 := time.Now()
	tk, err := ticker.New(context.Background(), 5*ms)
	require.NoError(t, err)
	defer tk.Stop()
	a, err := tk.Next(context.Background())
	require.NoError(t, err)
	b, err := tk.Next(context.Background())
	require.NoError(t, err)
	assert.True(t, b.After(a))
	assert.Zero(t, b.Sub(a)%(5*ms), "boundaries differ by whole periods")
	assert.False(t, a.Before(t0.Add(5*ms)))
}

// ExampleTicker shows a poll loop whose work takes a varying time, on a
// virtual clock: the ticks stay on the 1s grid.
func ExampleTicker() {
	_ = sched.Run(context.Background(), func(ctx context.Context) error {
		tk, err := ticker.New(ctx, time.Second)
		if err != nil {
			return err
		}
		defer tk.Stop()
		for i := range 3 {
			at, err := tk.Next(ctx)
			if err != nil {
				return err
			}
			fmt.Printf("tick %v\n", at.Sub(vclock.Epoch()))
			_ = sched.Sleep(ctx, time.Duration(i+1)*300*time.Millisecond) // the work
		}
		return nil
	}, sched.Virtual(time.Time{}))
	// Output:
	// tick 1s
	// tick 2s
	// tick 3s
}
