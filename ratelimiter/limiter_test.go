package ratelimiter_test

import (
	"context"
	"math"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/ratelimiter"
	"github.com/sluice-go/sluice/sched"
	"github.com/sluice-go/sluice/vclock"
)

func TestMain(m *testing.M) {
	if os.Getenv(sharedChildEnv) != "" {
		os.Exit(sharedChild()) // a child process of TestSharedCrossProcess
	}
	goleak.VerifyTestMain(m)
}

// run runs main in a virtual-time loop starting at vclock.Epoch() and fails
// the test on its error.
func run(t *testing.T, main func(ctx context.Context) error) {
	t.Helper()
	require.NoError(t, sched.Run(context.Background(), main, sched.Virtual(time.Time{})))
}

// since is the virtual time elapsed in the run.
func since(ctx context.Context) time.Duration { return sched.Now(ctx).Sub(vclock.Epoch()) }

func newLimiter(t *testing.T, ctx context.Context, rate float64, burst int) *ratelimiter.Limiter {
	t.Helper()
	l, err := ratelimiter.New(ctx, rate, burst)
	require.NoError(t, err)
	return l
}

// settle lets every fiber woken so far run before the caller goes on:
// runnable fibers run FIFO, so one Yield puts the caller behind them.
func settle(ctx context.Context) { sched.Yield(ctx) }

// ns is a duration of exactly n nanoseconds, for schedules of rates that do
// not divide a second.
func ns(n int64) time.Duration { return time.Duration(n) }

// acquireTimes has one fiber take n tokens, one at a time, and returns when
// each call returned.
func acquireTimes(t *testing.T, ctx context.Context, l *ratelimiter.Limiter, n int) []time.Duration {
	t.Helper()
	var at []time.Duration
	for range n {
		require.NoError(t, l.Acquire(ctx, 1))
		at = append(at, since(ctx))
	}
	return at
}

// TestSaturatedSchedule: a saturated limiter hands out its burst at once, then
// one token every 1/rate, at exact virtual instants.
func TestSaturatedSchedule(t *testing.T) {
	run(t, func(ctx context.Context) error {
		l := newLimiter(t, ctx, 100, 3)
		assert.Equal(t, 3.0, l.Tokens(), "starts full")
		got := acquireTimes(t, ctx, l, 7)
		ms := time.Millisecond
		assert.Equal(t, []time.Duration{0, 0, 0, 10 * ms, 20 * ms, 30 * ms, 40 * ms}, got)
		return nil
	})
}

// TestSaturatedScheduleManyFibers: the same schedule, shared FIFO between
// fibers that queue in a known order.
func TestSaturatedScheduleManyFibers(t *testing.T) {
	run(t, func(ctx context.Context) error {
		l := newLimiter(t, ctx, 10, 2)
		type grant struct {
			fiber int
			at    time.Duration
		}
		var grants []grant
		for i := range 5 {
			sched.Go(ctx, func(ctx context.Context) error {
				if err := l.Acquire(ctx, 1); err != nil {
					return err
				}
				grants = append(grants, grant{i, since(ctx)})
				return nil
			})
		}
		require.NoError(t, sched.Sleep(ctx, time.Second))
		ms := time.Millisecond
		assert.Equal(t, []grant{{0, 0}, {1, 0}, {2, 100 * ms}, {3, 200 * ms}, {4, 300 * ms}}, grants)
		return nil
	})
}

// TestFractionalRates: 0.5/s is one token every two seconds, and a rate
// that does not divide a second delivers token k at ceil(k·1e9/rate) ns.
func TestFractionalRates(t *testing.T) {
	run(t, func(ctx context.Context) error {
		l := newLimiter(t, ctx, 0.5, 1)
		assert.Equal(t, []time.Duration{0, 2 * time.Second, 4 * time.Second, 6 * time.Second}, acquireTimes(t, ctx, l, 4))
		return nil
	})
	run(t, func(ctx context.Context) error {
		l := newLimiter(t, ctx, 7.3, 2)
		// 1e9/7.3 = 136986301.37 ns; 2e9/7.3 = 273972602.74; 3e9/7.3 = 410958904.11
		assert.Equal(t, []time.Duration{0, 0, ns(136986302), ns(273972603), ns(410958905)}, acquireTimes(t, ctx, l, 5))
		// The fraction carries: by +1s, 7 whole tokens have accrued since
		// the bucket ran dry at 0 (7.3), 3 were handed out, 2 fit in the
		// bucket (burst) and the rest was dropped while it was full.
		require.NoError(t, sched.Sleep(ctx, time.Second-ns(410958905)))
		assert.Equal(t, 2.0, l.Tokens())
		return nil
	})
}

// TestBatchBeyondBurst: Acquire(50) on a burst of 10 at 100/s spends the 10
// at once and collects the other 40 as they accrue: done at exactly +400ms.
// The bucket is empty then, so the next token comes 10ms later.
func TestBatchBeyondBurst(t *testing.T) {
	run(t, func(ctx context.Context) error {
		l := newLimiter(t, ctx, 100, 10)
		require.NoError(t, l.Acquire(ctx, 50))
		assert.Equal(t, 400*time.Millisecond, since(ctx))
		assert.Equal(t, 0.0, l.Tokens())
		require.NoError(t, l.Acquire(ctx, 1))
		assert.Equal(t, 410*time.Millisecond, since(ctx))
		return nil
	})
}

// TestTimeoutHandsTokensBack: a waiter cancelled mid-wait returns the ctx's
// error at that exact instant and hands every token it had collected to the
// next waiter; with nobody behind it, to the bucket.
func TestTimeoutHandsTokensBack(t *testing.T) {
	ms := time.Millisecond
	// cancelAt returns a ctx that a fiber of its own cancels at +d.
	cancelAt := func(ctx context.Context, d time.Duration) context.Context {
		cctx, cancel := context.WithCancel(ctx)
		sched.Go(ctx, func(ctx context.Context) error {
			defer cancel()
			return sched.Sleep(ctx, d)
		})
		return cctx
	}
	run(t, func(ctx context.Context) error {
		l := newLimiter(t, ctx, 10, 5)
		require.NoError(t, l.Acquire(ctx, 5)) // empty at 0
		a := sched.Go(ctx, func(ctx context.Context) error {
			err := l.Acquire(cancelAt(ctx, 250*ms), 5) // collects tokens at 100 and 200ms
			assert.Equal(t, 250*ms, since(ctx))
			return err
		})
		var bAt time.Duration
		b := sched.Go(ctx, func(ctx context.Context) error {
			err := l.Acquire(ctx, 3) // a's 2 at 250ms, then 1 more at 300ms
			bAt = since(ctx)
			return err
		})
		assert.ErrorIs(t, a.Wait(ctx), context.Canceled)
		require.NoError(t, b.Wait(ctx))
		assert.Equal(t, 300*ms, bAt)
		return nil
	})
	run(t, func(ctx context.Context) error {
		l := newLimiter(t, ctx, 10, 5)
		require.NoError(t, l.Acquire(ctx, 5))
		assert.ErrorIs(t, l.Acquire(cancelAt(ctx, 250*ms), 5), context.Canceled)
		assert.Equal(t, 250*ms, since(ctx))
		// The 2 collected tokens are back in the bucket, plus half a token
		// accrued since 200ms.
		assert.InDelta(t, 2.5, l.Tokens(), 1e-9)
		assert.Equal(t, 0, l.Waiters())
		require.NoError(t, l.Acquire(ctx, 2))
		assert.Equal(t, 250*ms, since(ctx), "the two tokens were not lost")
		return nil
	})
}

// TestDeadlineFailsAtOnce: a wait that cannot end before ctx's deadline even
// if every waiter ahead gave up fails at once with an error matching
// context.DeadlineExceeded, taking nothing; one that could waits.
func TestDeadlineFailsAtOnce(t *testing.T) {
	ms := time.Millisecond
	run(t, func(ctx context.Context) error {
		l := newLimiter(t, ctx, 10, 5)
		require.NoError(t, l.Acquire(ctx, 3))          // 2 left: 3 more take 300ms
		tctx, cancel := sched.WithTimeout(ctx, 300*ms) // at the deadline is too late
		defer cancel()
		err := l.Acquire(tctx, 5)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Contains(t, err.Error(), "n=5")
		assert.Equal(t, time.Duration(0), since(ctx))
		assert.Equal(t, 2.0, l.Tokens(), "took nothing")
		tctx2, cancel2 := sched.WithTimeout(ctx, 301*ms)
		defer cancel2()
		require.NoError(t, l.Acquire(tctx2, 5))
		assert.Equal(t, 300*ms, since(ctx))
		return nil
	})
}

// TestCancelledMiddleWaiter: a waiter cancelled in the middle of the queue
// leaves without disturbing the order or the schedule of the others.
func TestCancelledMiddleWaiter(t *testing.T) {
	ms := time.Millisecond
	run(t, func(ctx context.Context) error {
		l := newLimiter(t, ctx, 10, 1)
		require.True(t, l.TryAcquire(1))
		var order []string
		start := func(name string, n int, cancelAfter time.Duration) *sched.Fiber {
			return sched.Go(ctx, func(ctx context.Context) error {
				if cancelAfter > 0 {
					var cancel context.CancelFunc
					ctx, cancel = sched.WithTimeout(ctx, cancelAfter)
					defer cancel()
				}
				err := l.Acquire(ctx, n)
				order = append(order, name+"@"+since(ctx).String())
				return err
			})
		}
		start("a", 2, 0)
		// m's token could come at 100ms if a gave up, so m waits (no
		// early failure) until its deadline.
		m := start("m", 1, 150*ms)
		start("c", 1, 0)
		assert.ErrorIs(t, m.Wait(ctx), context.DeadlineExceeded)
		require.NoError(t, sched.Sleep(ctx, time.Second))
		assert.Equal(t, []string{"m@150ms", "a@200ms", "c@300ms"}, order)
		return nil
	})
}

// TestStopReleasesWaiters: Stop wakes every parked Acquire with ErrStopped,
// reports true only once, and later calls fail at once.
func TestStopReleasesWaiters(t *testing.T) {
	run(t, func(ctx context.Context) error {
		l := newLimiter(t, ctx, 1, 1)
		require.True(t, l.TryAcquire(1))
		var fibers []*sched.Fiber
		for n := 1; n <= 3; n++ {
			fibers = append(fibers, sched.Go(ctx, func(ctx context.Context) error { return l.Acquire(ctx, n) }))
		}
		settle(ctx)
		assert.Equal(t, 3, l.Waiters())
		require.NoError(t, sched.Sleep(ctx, 500*time.Millisecond))
		assert.True(t, l.Running())
		assert.True(t, l.Stop())
		assert.False(t, l.Stop())
		assert.False(t, l.Running())
		for _, f := range fibers {
			assert.ErrorIs(t, f.Wait(ctx), ratelimiter.ErrStopped)
		}
		assert.Equal(t, 500*time.Millisecond, since(ctx), "released at the instant of Stop")
		assert.Equal(t, 0, l.Waiters())
		assert.ErrorIs(t, l.Acquire(ctx, 1), ratelimiter.ErrStopped)
		require.NoError(t, sched.Sleep(ctx, 10*time.Second))
		assert.False(t, l.TryAcquire(1), "no refills after Stop")
		return nil
	})
}

// TestUnstoppedLimiterEndsRun: a limiter nobody stops keeps no run open:
// Run returns as soon as the last fiber got its tokens, with no timer left
// armed, and the limiter (made with the run's context) is stopped by the
// run's end.
func TestUnstoppedLimiterEndsRun(t *testing.T) {
	vc := vclock.New(time.Time{})
	var l *ratelimiter.Limiter
	err := sched.Run(context.Background(), func(ctx context.Context) error {
		l = newLimiter(t, ctx, 5, 10)
		for range 3 {
			sched.Go(ctx, func(ctx context.Context) error { return l.Acquire(ctx, 4) })
		}
		return nil // no Stop
	}, sched.WithVirtualClock(vc))
	require.NoError(t, err)
	// 12 tokens: 10 at once, 2 more at 5/s, the last at +400ms.
	assert.Equal(t, vclock.Epoch().Add(400*time.Millisecond), vc.Now())
	assert.Equal(t, 0, vc.Pending(), "no timer left armed")
	assert.False(t, l.Running(), "the run's end stopped the limiter")
}

// TestAcquireReportsInDeadlock: a fiber that waits on a limiter whose refill
// can never come (its clock is a mock nobody advances) is not left hanging:
// the run reports a deadlock naming the wait and where it was made.
func TestAcquireReportsInDeadlock(t *testing.T) {
	// A limiter made outside the run, on a mock clock that never moves:
	// inside the loop it still uses its own clock, so the refill timer sits
	// on the mock and the loop can prove nothing will wake the fiber.
	l, err := ratelimiter.New(context.Background(), 1, 1, ratelimiter.WithClock(newFrozenMock()))
	require.NoError(t, err)
	require.True(t, l.TryAcquire(1))
	err = sched.Run(context.Background(), func(ctx context.Context) error {
		return l.Acquire(ctx, 2)
	}, sched.Virtual(time.Time{}))
	var dl *sched.DeadlockError
	require.ErrorAs(t, err, &dl)
	require.Len(t, dl.Parked, 1)
	assert.Equal(t, "ratelimiter.Acquire n=2", dl.Parked[0].Reason)
	assert.Contains(t, dl.Parked[0].Site, "limiter_test.go")
	assert.Equal(t, 0, l.Waiters(), "the stopped fiber left the queue")
}

func TestInvalidArguments(t *testing.T) {
	ctx := context.Background()
	for _, rate := range []float64{0, -1, math.NaN(), math.Inf(1), math.Inf(-1)} {
		_, err := ratelimiter.New(ctx, rate, 1)
		require.Error(t, err, "rate %v", rate)
		assert.Contains(t, err.Error(), "rate "+formatFloat(rate))
	}
	for _, burst := range []int{0, -1} {
		_, err := ratelimiter.New(ctx, 1, burst)
		require.Error(t, err, "burst %d", burst)
		assert.Contains(t, err.Error(), "burst "+formatInt(burst))
	}
	_, err := ratelimiter.New(ctx, 1, 1, ratelimiter.WithClock(nil))
	assert.Error(t, err)

	l := newLimiter(t, ctx, 1, 1)
	for _, n := range []int{-1, -7} {
		err := l.Acquire(ctx, n)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "n="+formatInt(n))
		assert.False(t, l.TryAcquire(n))
	}
	assert.False(t, l.TryAcquire(0))
	// Acquire(ctx, 0) returns nil at once, ctx.Err() when ctx is done.
	require.NoError(t, l.Acquire(ctx, 0))
	done, cancel := context.WithCancel(ctx)
	cancel()
	assert.ErrorIs(t, l.Acquire(done, 0), context.Canceled)
	assert.Equal(t, 1.0, l.Tokens(), "invalid calls took nothing")
	assert.Equal(t, 1.0, l.Rate())
	assert.Equal(t, 1, l.Burst())
}

func TestDoneContextWinsOverFreeTokens(t *testing.T) {
	l := newLimiter(t, context.Background(), 1, 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, l.Acquire(ctx, 1), context.Canceled)
	assert.Equal(t, 1.0, l.Tokens())
}

// TestVirtualHour: one virtual hour at 7.3/s, burst 3, with 50 fibers
// competing: exactly floor(7.3·3600) + 3 = 26283 tokens are handed out by
// the end of the hour (the last one at exactly 3600s), FIFO keeps every fiber
// served, and no token is lost.
func TestVirtualHour(t *testing.T) {
	const (
		rate    = 7.3
		burst   = 3
		fibers  = 50
		horizon = time.Hour
	)
	var byHour, total int
	var grants []time.Duration // in grant order, which is time order
	perFiber := make([]int, fibers)
	run(t, func(ctx context.Context) error {
		l := newLimiter(t, ctx, rate, burst)
		// Run a little past the hour, and count what came by the hour.
		hctx, cancel := sched.WithTimeout(ctx, horizon+time.Second)
		defer cancel()
		var all []*sched.Fiber
		for i := range fibers {
			all = append(all, sched.Go(hctx, func(ctx context.Context) error {
				for l.Acquire(ctx, 1) == nil {
					total++
					grants = append(grants, since(ctx))
					if since(ctx) <= horizon {
						byHour++
						perFiber[i]++
					}
				}
				return nil
			}))
		}
		for _, f := range all {
			require.NoError(t, f.Wait(ctx))
		}
		return nil
	})
	want := int(math.Floor(rate*3600)) + burst
	assert.Equal(t, 26283, want)
	assert.Equal(t, want, byHour)
	assert.Equal(t, int(math.Floor(rate*3601))+burst, total, "one more second at 7.3/s")
	// The bound over every window [t_i, t_j] of grants i..j:
	// j−i+1 ≤ burst + rate·(t_j−t_i), i.e. u_j − u_i ≤ burst − 1 with
	// u_k = k − rate·t_k. One pass with a running minimum checks all pairs.
	minU, worst := math.Inf(1), math.Inf(-1)
	for k, at := range grants {
		u := float64(k) - rate*at.Seconds()
		minU = min(minU, u)
		worst = max(worst, u-minU)
	}
	t.Logf("tightest window: %.6f of the allowed %d extra", worst, burst-1)
	assert.LessOrEqual(t, worst, float64(burst-1)+1e-6, "some window admitted more than burst + rate·window")
	for i, n := range perFiber {
		// FIFO round-robin: every fiber gets its turn. Fiber 0 took the
		// whole burst at 0, before the others had started.
		assert.InDelta(t, float64(want)/fibers, float64(n), burst+1, "fiber %d", i)
	}
}

// TestIdleLimiterArmsNothing: a full or idle limiter arms no timer; one
// waiter arms exactly one, and it is gone once the waiter is served.
// TryAcquire never barges past a waiter, even when a token has accrued.
func TestIdleLimiterArmsNothing(t *testing.T) {
	vc := vclock.New(time.Time{})
	err := sched.Run(context.Background(), func(ctx context.Context) error {
		l := newLimiter(t, ctx, 10, 2)
		assert.Equal(t, 0, vc.Pending(), "full: no timer")
		require.True(t, l.TryAcquire(2))
		assert.Equal(t, 0, vc.Pending(), "empty but nobody waits: no timer")
		f := sched.Go(ctx, func(ctx context.Context) error { return l.Acquire(ctx, 2) })
		sched.Yield(ctx)
		assert.Equal(t, 1, vc.Pending(), "one waiter: one timer")
		require.NoError(t, sched.Sleep(ctx, 150*time.Millisecond)) // one token accrued, collected by the waiter
		assert.False(t, l.TryAcquire(1), "no barging past the waiter")
		require.NoError(t, f.Wait(ctx))
		assert.Equal(t, 200*time.Millisecond, since(ctx))
		assert.Equal(t, 0, vc.Pending(), "served: no timer left")
		require.NoError(t, sched.Sleep(ctx, time.Hour))
		assert.Equal(t, 2.0, l.Tokens(), "refilled lazily to burst, nothing beyond")
		return nil
	}, sched.WithVirtualClock(vc))
	require.NoError(t, err)
}
