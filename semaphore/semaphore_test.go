package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/sched"
	"github.com/sluice-go/sluice/semaphore"
	"github.com/sluice-go/sluice/vclock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// event records what happened to one waiter and when, in virtual time since
// the start of the run.
type event struct {
	name string
	at   time.Duration
	err  error
}

// run runs main in a virtual-time loop and fails the test on its error.
func run(t *testing.T, main func(ctx context.Context) error) {
	t.Helper()
	require.NoError(t, sched.Run(context.Background(), main, sched.Virtual(time.Time{})))
}

// settle lets every fiber woken so far run before the caller goes on:
// runnable fibers run FIFO, so one Yield puts the caller behind them.
func settle(ctx context.Context) { sched.Yield(ctx) }

func since(ctx context.Context) time.Duration { return sched.Now(ctx).Sub(vclock.Epoch()) }

// TestFIFOMixedWeightsCancelledMiddle: waiters of mixed sizes are served in
// the order they parked, nobody barges past the head (not a later small
// waiter, not TryAcquire), and a cancelled waiter in the middle leaves the
// queue at its exact deadline without taking or losing a permit.
func TestFIFOMixedWeightsCancelledMiddle(t *testing.T) {
	run(t, func(ctx context.Context) error {
		s := semaphore.New(5)
		require.NoError(t, s.Acquire(ctx, 5))
		var events []event
		waiter := func(name string, n int64, timeout time.Duration) {
			sched.Go(ctx, func(ctx context.Context) error {
				if timeout > 0 {
					var cancel context.CancelFunc
					ctx, cancel = sched.WithTimeout(ctx, timeout)
					defer cancel()
				}
				err := s.Acquire(ctx, n)
				events = append(events, event{name, since(ctx), err})
				return nil
			})
		}
		waiter("a", 2, 0)
		waiter("b", 4, time.Second) // the middle waiter gives up at +1s
		waiter("c", 3, 0)
		waiter("d", 1, 0)
		sched.Yield(ctx) // let all four park, in order
		assert.Equal(t, 4, s.Waiters())

		require.NoError(t, sched.Sleep(ctx, 2*time.Second))
		assert.Equal(t, 3, s.Waiters(), "b left the queue at its deadline")
		s.Release(1) // a needs 2: nobody may take this one permit
		settle(ctx)
		assert.Equal(t, int64(1), s.Available())
		assert.False(t, s.TryAcquire(1), "TryAcquire must not barge past waiters")

		require.NoError(t, sched.Sleep(ctx, time.Second))
		s.Release(4) // 5 free: a takes 2, c takes 3, d waits for 1
		settle(ctx)
		require.NoError(t, sched.Sleep(ctx, time.Second))
		s.Release(2) // a gives back 2: d takes 1
		settle(ctx)

		assert.Equal(t, []event{
			{"b", 1 * time.Second, context.DeadlineExceeded},
			{"a", 3 * time.Second, nil},
			{"c", 3 * time.Second, nil},
			{"d", 4 * time.Second, nil},
		}, events)
		assert.Equal(t, 0, s.Waiters())
		assert.Equal(t, int64(1), s.Available()) // c holds 3, d holds 1
		return nil
	})
}

// TestCancelledHeadLetsOthersGo: when the head waiter (too big for what is
// free) is cancelled, the smaller waiters behind it are served at that same
// instant.
func TestCancelledHeadLetsOthersGo(t *testing.T) {
	run(t, func(ctx context.Context) error {
		s := semaphore.New(4)
		require.NoError(t, s.Acquire(ctx, 2)) // 2 free
		var events []event
		head := sched.Go(ctx, func(ctx context.Context) error {
			ctx, cancel := sched.WithTimeout(ctx, 500*time.Millisecond)
			defer cancel()
			return s.Acquire(ctx, 4)
		})
		sched.Go(ctx, func(ctx context.Context) error {
			err := s.Acquire(ctx, 2)
			events = append(events, event{"small", since(ctx), err})
			return nil
		})
		assert.ErrorIs(t, head.Wait(ctx), context.DeadlineExceeded)
		settle(ctx)
		assert.Equal(t, []event{{"small", 500 * time.Millisecond, nil}}, events)
		assert.Equal(t, int64(0), s.Available())
		return nil
	})
}

func TestTryAcquireAndRelease(t *testing.T) {
	s := semaphore.New(3)
	assert.Equal(t, int64(3), s.Size())
	assert.True(t, s.TryAcquire(2))
	assert.False(t, s.TryAcquire(2))
	assert.True(t, s.TryAcquire(1))
	assert.True(t, s.TryAcquire(0))
	assert.Equal(t, int64(0), s.Available())
	s.Release(3)
	assert.Equal(t, int64(3), s.Available())
}

func TestMisusePanics(t *testing.T) {
	s := semaphore.New(2)
	assert.PanicsWithValue(t, "semaphore: New(-1): negative size", func() { semaphore.New(-1) })
	assert.PanicsWithValue(t, "semaphore: Acquire with negative n=-1", func() { _ = s.Acquire(context.Background(), -1) })
	assert.PanicsWithValue(t, "semaphore: TryAcquire with negative n=-2", func() { s.TryAcquire(-2) })
	assert.PanicsWithValue(t, "semaphore: Release with negative n=-3", func() { s.Release(-3) })
	require.True(t, s.TryAcquire(1))
	assert.PanicsWithValue(t, "semaphore: Release(2) with only 1 permits held", func() { s.Release(2) })
	s.Release(1) // the failed Release changed nothing
	assert.Equal(t, int64(2), s.Available())
}

func TestAcquireBeyondSizeFailsAtOnce(t *testing.T) {
	s := semaphore.New(2)
	err := s.Acquire(context.Background(), 3)
	require.ErrorIs(t, err, semaphore.ErrExceedsSize)
	assert.Contains(t, err.Error(), "n=3")
	assert.Contains(t, err.Error(), "size 2")
	assert.Equal(t, 0, s.Waiters())
}

func TestDoneContextWinsOverFreePermits(t *testing.T) {
	s := semaphore.New(1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, s.Acquire(ctx, 1), context.Canceled)
	assert.Equal(t, int64(1), s.Available())
}

// TestCloseReleasesWaiters: Close wakes parked fibers and goroutines with its
// error, and later Acquire calls fail at once with it.
func TestCloseReleasesWaiters(t *testing.T) {
	errShutdown := errors.New("shutting down")
	s := semaphore.New(1)
	require.True(t, s.TryAcquire(1))
	// A goroutine waiter...
	gErr := make(chan error, 1)
	go func() { gErr <- s.Acquire(context.Background(), 1) }()
	run(t, func(ctx context.Context) error {
		// ...and a fiber waiter.
		f := sched.Go(ctx, func(ctx context.Context) error { return s.Acquire(ctx, 1) })
		settle(ctx)
		for s.Waiters() < 2 { // the goroutine parks on its own time: spin, no sleep
			require.NoError(t, sched.Blocking(ctx, func() error { time.Sleep(0); return nil }))
		}
		s.Close(errShutdown)
		s.Close(errors.New("second close is ignored"))
		assert.ErrorIs(t, f.Wait(ctx), errShutdown)
		return nil
	})
	assert.ErrorIs(t, <-gErr, errShutdown)
	assert.ErrorIs(t, s.Acquire(context.Background(), 1), errShutdown)
	assert.False(t, s.TryAcquire(0))
	s.Release(1) // holders may still release
	assert.Equal(t, int64(1), s.Available())

	s2 := semaphore.New(1)
	s2.Close(nil)
	assert.ErrorIs(t, s2.Acquire(context.Background(), 1), semaphore.ErrClosed)
}

// TestDeadlockReportNamesTheWait: under a virtual clock, a fiber parked on a
// semaphore nobody will release is reported, with its request.
func TestDeadlockReportNamesTheWait(t *testing.T) {
	s := semaphore.New(3)
	err := sched.Run(context.Background(), func(ctx context.Context) error {
		require.True(t, s.TryAcquire(3))
		return s.Acquire(ctx, 3)
	}, sched.Virtual(time.Time{}))
	var dl *sched.DeadlockError
	require.ErrorAs(t, err, &dl)
	require.Len(t, dl.Parked, 1)
	assert.Equal(t, "semaphore.Acquire n=3", dl.Parked[0].Reason)
	assert.Contains(t, dl.Parked[0].Site, "semaphore_test.go")
	assert.Equal(t, 0, s.Waiters(), "the stopped fiber left the queue")
}

// TestGrantVersusCancelStress races grants against cancellations from every
// direction at once: goroutines with real-time timeouts, TryAcquire callers,
// and fibers with loop timeouts, in a real-clock loop (deadlines cancel from
// timer goroutines) and in a virtual one (deadlines fire on the loop's
// goroutine while the goroutines grant). It proves that no permit is lost or
// granted twice: the permits held at any moment never exceed the size, and
// at the end every permit is free again and the queue is empty.
func TestGrantVersusCancelStress(t *testing.T) {
	t.Run("loop=real", func(t *testing.T) { grantVersusCancel(t, sched.WithClock(clock.New())) })
	t.Run("loop=virtual", func(t *testing.T) { grantVersusCancel(t, sched.Virtual(time.Time{})) })
}

func grantVersusCancel(t *testing.T, loopOpt sched.Option) {
	const size = 4
	s := semaphore.New(size)
	var held, grants, cancels atomic.Int64
	use := func(n int64) {
		if h := held.Add(n); h > size {
			t.Errorf("%d permits held on a semaphore of size %d", h, size)
		}
		grants.Add(1)
		held.Add(-n)
		s.Release(n)
	}
	rounds := 3000
	if testing.Short() {
		rounds = 500
	}
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range rounds {
				n := 1 + r.Int64N(size)
				if r.IntN(4) == 0 {
					if s.TryAcquire(n) {
						use(n)
					}
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.IntN(50))*time.Microsecond)
				if err := s.Acquire(ctx, n); err == nil {
					use(n)
				} else {
					cancels.Add(1)
				}
				cancel()
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := sched.Run(context.Background(), func(ctx context.Context) error {
			for f := range 4 {
				sched.Go(ctx, func(ctx context.Context) error {
					r := rand.New(rand.NewPCG(uint64(f), 2))
					for range rounds {
						n := 1 + r.Int64N(size)
						tctx, cancel := sched.WithTimeout(ctx, time.Duration(r.IntN(50))*time.Microsecond)
						if err := s.Acquire(tctx, n); err == nil {
							use(n)
						} else {
							cancels.Add(1)
						}
						cancel()
					}
					return nil
				})
			}
			return nil
		}, loopOpt)
		assert.NoError(t, err)
	}()
	wg.Wait()
	assert.Equal(t, int64(size), s.Available(), "a permit was lost")
	assert.Equal(t, 0, s.Waiters())
	assert.Equal(t, int64(0), held.Load())
	t.Logf("grants=%d cancellations=%d", grants.Load(), cancels.Load())
	assert.Positive(t, grants.Load())
	assert.Positive(t, cancels.Load(), "the stress never exercised a cancellation")
}

// TestFibersAndGoroutinesShare: one semaphore serves a fiber and a plain
// goroutine in FIFO order.
func TestFibersAndGoroutinesShare(t *testing.T) {
	s := semaphore.New(1)
	require.True(t, s.TryAcquire(1))
	gotG := make(chan struct{})
	go func() {
		if err := s.Acquire(context.Background(), 1); err == nil {
			close(gotG)
		}
	}()
	for s.Waiters() < 1 {
		time.Sleep(0) // yield until the goroutine has parked; no timed sleep
	}
	run(t, func(ctx context.Context) error {
		f := sched.Go(ctx, func(ctx context.Context) error { return s.Acquire(ctx, 1) })
		settle(ctx)
		require.Equal(t, 2, s.Waiters())
		s.Release(1) // to the goroutine, which parked first
		require.NoError(t, sched.Blocking(ctx, func() error { <-gotG; return nil }))
		assert.Equal(t, 1, s.Waiters())
		s.Release(1) // the goroutine's permit, now to the fiber
		return f.Wait(ctx)
	})
	assert.Equal(t, int64(0), s.Available())
}

func ExampleSemaphore() {
	// At most two fetches in flight; the others wait their turn in order.
	sem := semaphore.New(2)
	err := sched.Run(context.Background(), func(ctx context.Context) error {
		for i := range 4 {
			sched.Go(ctx, func(ctx context.Context) error {
				if err := sem.Acquire(ctx, 1); err != nil {
					return err
				}
				defer sem.Release(1)
				fmt.Printf("fetch %d starts at +%v\n", i, since(ctx))
				return sched.Sleep(ctx, time.Second) // the fetch
			})
		}
		return nil
	}, sched.Virtual(time.Time{}))
	fmt.Println("err:", err)
	// Output:
	// fetch 0 starts at +0s
	// fetch 1 starts at +0s
	// fetch 2 starts at +1s
	// fetch 3 starts at +1s
	// err: <nil>
}

func ExampleSemaphore_Acquire_timeout() {
	sem := semaphore.New(1)
	sem.TryAcquire(1) // held elsewhere, for longer than we will wait
	err := sched.Run(context.Background(), func(ctx context.Context) error {
		ctx, cancel := sched.WithTimeout(ctx, 250*time.Millisecond)
		defer cancel()
		err := sem.Acquire(ctx, 1)
		fmt.Printf("gave up at +%v: %v\n", since(ctx), err)
		return nil
	}, sched.Virtual(time.Time{}))
	fmt.Println("err:", err, "waiters:", sem.Waiters())
	// Output:
	// gave up at +250ms: context deadline exceeded
	// err: <nil> waiters: 0
}

// TestStoppedFiberLeavesQueue: a daemon fiber that waits with a context that
// is never cancelled is stopped (not cancelled) when its run ends; its
// waiter still leaves the queue, so the next Release is not handed to a
// fiber that no longer exists.
func TestStoppedFiberLeavesQueue(t *testing.T) {
	s := semaphore.New(2)
	require.True(t, s.TryAcquire(2))
	run(t, func(ctx context.Context) error {
		sched.Daemon(ctx, func(ctx context.Context) error {
			return s.Acquire(context.WithoutCancel(ctx), 2) // ignores the daemon's cancellation
		})
		settle(ctx)
		assert.Equal(t, 1, s.Waiters())
		return nil
	})
	assert.Equal(t, 0, s.Waiters(), "the stopped daemon left the queue")
	s.Release(2)
	assert.True(t, s.TryAcquire(2), "the permits were not handed to the dead fiber")
}

// An Acquire under a context the loop cannot see through (a standard child
// of a wrapper that hides the loop context's AfterFunc) ends when the
// wrapped sched.WithTimeout does, at its virtual deadline, under every
// seed: not a DeadlockError (nothing else is armed) nor a wake at the next
// timer (another fiber sleeps an hour). The permits stay whole.
func TestAcquireUnderWrappedTimeoutEndsAtItsDeadline(t *testing.T) {
	for _, other := range []bool{false, true} {
		for seed := range uint64(20) {
			s := semaphore.New(1)
			var woke time.Time
			err := sched.Run(context.Background(), func(ctx context.Context) error {
				if other {
					sched.Go(ctx, func(ctx context.Context) error { return sched.Sleep(ctx, time.Hour) })
				}
				require.True(t, s.TryAcquire(1))
				tctx, tcancel := sched.WithTimeout(ctx, time.Second)
				defer tcancel()
				wctx, cancel := context.WithCancel(struct{ context.Context }{tctx})
				defer cancel()
				err := s.Acquire(wctx, 1)
				woke = sched.Now(ctx)
				return err
			}, sched.Virtual(time.Time{}), sched.WithSeed(seed))
			require.ErrorIs(t, err, context.DeadlineExceeded, "seed %d, another timer %v", seed, other)
			assert.Equal(t, vclock.Epoch().Add(time.Second), woke, "seed %d, another timer %v", seed, other)
			assert.Equal(t, 0, s.Waiters())
			s.Release(1)
			assert.Equal(t, int64(1), s.Available())
		}
	}
}
