package sched_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/sched"
	"github.com/sluice-go/sluice/vclock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// since is the virtual time elapsed since the epoch of a Virtual(zero) run.
func since(ctx context.Context) time.Duration { return sched.Now(ctx).Sub(vclock.Epoch()) }

// runV runs main under a fresh virtual clock.
func runV(main func(ctx context.Context) error) error {
	return sched.Run(context.Background(), main, sched.Virtual(time.Time{}))
}

// trace records events with their virtual time; fibers run one at a time,
// and goroutines reach it only through the loop, but a mutex keeps -race
// honest for the Blocking tests.
type trace struct {
	mu  sync.Mutex
	evs []string
}

func (tr *trace) add(ctx context.Context, format string, args ...any) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.evs = append(tr.evs, fmt.Sprintf("%v ", since(ctx))+fmt.Sprintf(format, args...))
}

func (tr *trace) get() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.evs...)
}

func TestNestedSleepsWakeAtExactTimes(t *testing.T) {
	var tr trace
	err := runV(func(ctx context.Context) error {
		outer := sched.Go(ctx, func(ctx context.Context) error {
			require.NoError(t, sched.Sleep(ctx, 2*time.Second))
			tr.add(ctx, "outer woke")
			inner := sched.Go(ctx, func(ctx context.Context) error {
				require.NoError(t, sched.Sleep(ctx, 500*time.Millisecond))
				tr.add(ctx, "inner woke")
				return nil
			})
			require.NoError(t, sched.Sleep(ctx, time.Second))
			tr.add(ctx, "outer woke again")
			return inner.Wait(ctx)
		})
		require.NoError(t, sched.Sleep(ctx, 1500*time.Millisecond))
		tr.add(ctx, "main woke")
		require.NoError(t, outer.Wait(ctx))
		tr.add(ctx, "main joined")
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, []string{
		"1.5s main woke",
		"2s outer woke",
		"2.5s inner woke",
		"3s outer woke again",
		"3s main joined",
	}, tr.get())
}

func TestSleepZeroYieldsAndNegativeIsAnError(t *testing.T) {
	var tr trace
	require.NoError(t, runV(func(ctx context.Context) error {
		sched.Go(ctx, func(ctx context.Context) error { tr.add(ctx, "other"); return nil })
		require.NoError(t, sched.Sleep(ctx, 0))
		tr.add(ctx, "main")
		err := sched.Sleep(ctx, -time.Second)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "sched: Sleep with negative duration -1s")
		return nil
	}))
	assert.Equal(t, []string{"0s other", "0s main"}, tr.get())
}

func TestTimeoutsAtTheVirtualDeadline(t *testing.T) {
	require.NoError(t, runV(func(ctx context.Context) error {
		tctx, cancel := sched.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		dl, ok := tctx.Deadline()
		require.True(t, ok)
		assert.Equal(t, vclock.Epoch().Add(3*time.Second), dl)

		err := sched.Sleep(tctx, time.Hour)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, 3*time.Second, since(ctx), "woken at exactly the deadline")
		assert.Equal(t, context.DeadlineExceeded, tctx.Err())
		assert.Equal(t, context.DeadlineExceeded, context.Cause(tctx))
		return nil
	}))
}

func TestNestedDeadlinesCompose(t *testing.T) {
	require.NoError(t, runV(func(ctx context.Context) error {
		outer, cancelOuter := sched.WithTimeout(ctx, 2*time.Second)
		defer cancelOuter()
		// A later inner deadline does not extend the outer one.
		inner, cancelInner := sched.WithTimeout(outer, 5*time.Second)
		defer cancelInner()
		dl, _ := inner.Deadline()
		assert.Equal(t, vclock.Epoch().Add(2*time.Second), dl)
		// An earlier one wins.
		tight, cancelTight := sched.WithTimeout(outer, time.Second)
		defer cancelTight()
		// A standard context derived from a loop context inherits its error.
		std, cancelStd := context.WithCancel(inner)
		defer cancelStd()

		require.ErrorIs(t, sched.Sleep(tight, time.Hour), context.DeadlineExceeded)
		assert.Equal(t, time.Second, since(ctx))
		assert.NoError(t, outer.Err())

		require.ErrorIs(t, sched.Sleep(inner, time.Hour), context.DeadlineExceeded)
		assert.Equal(t, 2*time.Second, since(ctx))
		<-std.Done()
		assert.Equal(t, context.DeadlineExceeded, std.Err(), "std child of a loop deadline")

		// Cancelling by hand reads Canceled, and a context already done
		// fails at once without moving time.
		c2, cancel2 := sched.WithTimeout(ctx, time.Minute)
		cancel2()
		assert.Equal(t, context.Canceled, c2.Err())
		require.ErrorIs(t, sched.Sleep(c2, time.Second), context.Canceled)
		past, cancelPast := sched.WithDeadline(ctx, vclock.Epoch())
		defer cancelPast()
		assert.Equal(t, context.DeadlineExceeded, past.Err())
		assert.Equal(t, 2*time.Second, since(ctx))
		return nil
	}))
}

// A context already done makes a Waiter fail at once, without parking: a
// fiber queued behind it has not run when Wait returns.
func TestDoneContextFailsWithoutParking(t *testing.T) {
	require.NoError(t, runV(func(ctx context.Context) error {
		ran := false
		sched.Go(ctx, func(ctx context.Context) error { ran = true; return nil })
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		cancelled := false
		w := &sched.Waiter{Reason: "test", OnCancel: func() { cancelled = true }}
		w.Prepare(cctx)
		require.ErrorIs(t, w.Wait(cctx), context.Canceled)
		assert.True(t, cancelled)
		assert.False(t, ran, "Wait parked although its context was done")
		return nil
	}))
}

// A standard context cancelled by another fiber wakes its waiter at that
// very instant: time does not jump while the standard library's callback
// goroutine is on its way.
func TestStdContextCancelledByAFiberWakesAtThatInstant(t *testing.T) {
	for i := 0; i < 50; i++ {
		require.NoError(t, runV(func(ctx context.Context) error {
			cctx, cancel := context.WithCancel(ctx)
			var woke time.Duration
			f := sched.Go(ctx, func(ctx context.Context) error {
				w := &sched.Waiter{Reason: "test"}
				w.Prepare(cctx)
				err := w.Wait(cctx)
				woke = since(ctx)
				return err
			})
			sched.Go(ctx, func(ctx context.Context) error { return sched.Sleep(ctx, time.Hour) })
			require.NoError(t, sched.Sleep(ctx, time.Second))
			cancel()
			require.ErrorIs(t, f.Wait(ctx), context.Canceled)
			assert.Equal(t, time.Second, woke)
			return nil
		}))
	}
}

func TestDeadlockTwoFibersWaitingOnEachOther(t *testing.T) {
	err := runV(func(ctx context.Context) error {
		var a, b *sched.Fiber
		ready := &sched.Waiter{}
		a = sched.Go(ctx, func(ctx context.Context) error {
			require.NoError(t, sched.Sleep(ctx, time.Second))
			return b.Wait(ctx)
		})
		b = sched.Go(ctx, func(ctx context.Context) error {
			return a.Wait(ctx)
		})
		_ = ready
		return a.Wait(ctx)
	})
	var dl *sched.DeadlockError
	require.ErrorAs(t, err, &dl)
	assert.Equal(t, vclock.Epoch().Add(time.Second), dl.At)
	require.Len(t, dl.Parked, 3)
	for i, p := range dl.Parked {
		assert.Equal(t, uint64(i+1), p.ID)
		assert.Equal(t, "Fiber.Wait", p.Reason)
		assert.False(t, p.Daemon)
		assert.True(t, strings.HasPrefix(p.Site, "sched_test.go:"), "site %q", p.Site)
	}
	assert.Contains(t, err.Error(), "sched: deadlock at 2000-01-01T00:00:01Z: 3 fiber(s) parked")
	assert.Contains(t, err.Error(), "fiber 2 waits on Fiber.Wait at sched_test.go:")
}

func TestDeadlockWaiterNobodyWakes(t *testing.T) {
	var line int
	err := runV(func(ctx context.Context) error {
		sched.Daemon(ctx, func(ctx context.Context) error {
			w := &sched.Waiter{Reason: "daemon idles"}
			w.Prepare(ctx)
			return w.Wait(ctx) // ends with the run: never a deadlock of its own
		})
		w := &sched.Waiter{Reason: "semaphore.Acquire", N: 3}
		w.Prepare(ctx)
		_, _, line, _ = runtime.Caller(0)
		return w.Wait(ctx) // parked here, one line below the Caller
	})
	var dl *sched.DeadlockError
	require.ErrorAs(t, err, &dl)
	require.Len(t, dl.Parked, 2, "daemons are listed too")
	assert.Equal(t, "semaphore.Acquire n=3", dl.Parked[0].Reason)
	assert.Equal(t, fmt.Sprintf("sched_test.go:%d", line+1), dl.Parked[0].Site)
	assert.False(t, dl.Parked[0].Daemon)
	assert.Equal(t, "daemon idles", dl.Parked[1].Reason)
	assert.True(t, dl.Parked[1].Daemon)
}

// Daemons never keep a run open: when main ends they are cancelled and
// finish; one that parks again after cancellation is stopped, its defers run.
func TestDaemonsNeverHoldARun(t *testing.T) {
	var sawCancel, stubbornDeferRan bool
	var ticks int
	err := runV(func(ctx context.Context) error {
		sched.Daemon(ctx, func(ctx context.Context) error {
			for {
				if err := sched.Sleep(ctx, time.Second); err != nil {
					sawCancel = errors.Is(err, context.Canceled)
					return err
				}
				ticks++
			}
		})
		sched.Daemon(ctx, func(ctx context.Context) error {
			defer func() { stubbornDeferRan = true }()
			first := &sched.Waiter{Reason: "until cancelled"}
			first.Prepare(ctx)
			_ = first.Wait(ctx)
			w := &sched.Waiter{Reason: "ignores cancellation"}
			w.Prepare(context.WithoutCancel(ctx))
			return w.Wait(context.WithoutCancel(ctx))
		})
		return sched.Sleep(ctx, 3500*time.Millisecond)
	})
	require.NoError(t, err)
	assert.Equal(t, 3, ticks)
	assert.True(t, sawCancel)
	assert.True(t, stubbornDeferRan)
}

func TestDaemonFromOutsideALoopPanics(t *testing.T) {
	assert.PanicsWithValue(t, "sched.Daemon called with a context that is not inside a sched.Run loop", func() {
		sched.Daemon(context.Background(), func(context.Context) error { return nil })
	})
	assert.PanicsWithValue(t, "sched.Go called with a context that is not inside a sched.Run loop", func() {
		sched.Go(context.Background(), func(context.Context) error { return nil })
	})
	require.NoError(t, runV(func(ctx context.Context) error {
		assert.PanicsWithValue(t, "sched.Go with a nil func", func() { sched.Go(ctx, nil) })
		return nil
	}))
	require.EqualError(t, sched.Run(context.Background(), nil), "sched: Run with a nil main func")
}

func TestAdvanceErrors(t *testing.T) {
	require.ErrorIs(t, sched.Advance(context.Background(), time.Second), sched.ErrNotInLoop)
	require.NoError(t, sched.Run(context.Background(), func(ctx context.Context) error {
		require.ErrorIs(t, sched.Advance(ctx, time.Second), sched.ErrNotVirtual)
		return nil
	}))
	require.NoError(t, runV(func(ctx context.Context) error {
		require.ErrorContains(t, sched.Advance(ctx, -time.Second), "sched: Advance by negative duration -1s")
		return nil
	}))
}

// Advance fires timers one by one and runs the fibers each one wakes before
// the next, stopping at exactly the target.
func TestAdvanceStepByStep(t *testing.T) {
	var tr trace
	require.NoError(t, runV(func(ctx context.Context) error {
		for i := 1; i <= 3; i++ {
			sched.Go(ctx, func(ctx context.Context) error {
				require.NoError(t, sched.Sleep(ctx, time.Duration(i)*time.Second))
				tr.add(ctx, "sleeper %d woke", i)
				// Work a woken fiber does at its instant, including a
				// follow-up timer inside the window.
				require.NoError(t, sched.Sleep(ctx, 100*time.Millisecond))
				tr.add(ctx, "sleeper %d done", i)
				return nil
			})
		}
		require.NoError(t, sched.Advance(ctx, 2050*time.Millisecond))
		tr.add(ctx, "advanced")
		require.NoError(t, sched.Advance(ctx, 0))
		tr.add(ctx, "advanced by zero")
		return nil
	}))
	assert.Equal(t, []string{
		"1s sleeper 1 woke",
		"1.1s sleeper 1 done",
		"2s sleeper 2 woke",
		"2.05s advanced",
		"2.05s advanced by zero",
		"2.1s sleeper 2 done",
		"3s sleeper 3 woke",
		"3.1s sleeper 3 done",
	}, tr.get())
}

// program is a mixed yield/sleep workload whose trace must not vary.
func program(tr *trace) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		for i := 0; i < 20; i++ {
			sched.Go(ctx, func(ctx context.Context) error {
				for j := 0; j < 10; j++ {
					switch (i*7 + j*3) % 4 {
					case 0:
						sched.Yield(ctx)
					case 1:
						_ = sched.Sleep(ctx, time.Duration((i+j)%5)*time.Millisecond)
					case 2:
						tctx, cancel := sched.WithTimeout(ctx, time.Duration(j)*time.Millisecond)
						_ = sched.Sleep(tctx, time.Duration(i)*time.Millisecond)
						cancel()
					default:
						sched.Go(ctx, func(ctx context.Context) error {
							return sched.Sleep(ctx, time.Duration(i)*time.Microsecond)
						})
					}
					tr.add(ctx, "f%d step %d", i, j)
				}
				return nil
			})
		}
		return nil
	}
}

func TestSameProgramSameTrace(t *testing.T) {
	var first trace
	require.NoError(t, runV(program(&first)))
	require.Len(t, first.get(), 200)
	for run := 0; run < 30; run++ {
		var tr trace
		require.NoError(t, runV(program(&tr)))
		require.Equal(t, first.get(), tr.get(), "run %d", run)
	}
}

// While a Blocking call is in flight, virtual time stands still even though
// a timer is due; the call's real work sees the same instant throughout.
func TestVirtualTimeHeldWhileBlocking(t *testing.T) {
	vc := vclock.New(time.Time{})
	var tr trace
	require.NoError(t, sched.Run(context.Background(), func(ctx context.Context) error {
		sched.Go(ctx, func(ctx context.Context) error {
			require.NoError(t, sched.Sleep(ctx, time.Hour))
			tr.add(ctx, "sleeper woke")
			return nil
		})
		start := vc.Now()
		err := sched.Blocking(ctx, func() error {
			for i := 0; i < 1000; i++ {
				runtime.Gosched()
				if !vc.Now().Equal(start) {
					return fmt.Errorf("virtual time moved to %v during Blocking", vc.Now())
				}
			}
			return errors.New("real work result")
		})
		require.EqualError(t, err, "real work result")
		tr.add(ctx, "blocking returned")
		return nil
	}, sched.WithVirtualClock(vc)))
	assert.Equal(t, []string{"0s blocking returned", "1h0m0s sleeper woke"}, tr.get())
}

func TestBlockingPanicReachesTheFiber(t *testing.T) {
	err := runV(func(ctx context.Context) error {
		return sched.Blocking(ctx, func() error { panic("io exploded") })
	})
	var pe *sched.PanicError
	require.ErrorAs(t, err, &pe)
	assert.Contains(t, fmt.Sprint(pe.Value), "sched: panic in Blocking func: io exploded")
}

// Under a real clock driven by a clock.Mock, a timer armed by a fiber fires
// on mock.Add, and a cancel from a plain goroutine wakes a parked fiber.
func TestRealClockModeWithMockAndOutsideCancel(t *testing.T) {
	mock := clock.NewMock()
	start := mock.Now()
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	armed := make(chan struct{})
	parked := make(chan struct{})
	var slept time.Duration
	var waitErr error
	done := make(chan error, 1)
	go func() {
		done <- sched.Run(parent, func(ctx context.Context) error {
			sched.Go(ctx, func(ctx context.Context) error {
				w := &sched.Waiter{Reason: "forever"}
				w.Prepare(ctx)
				close(parked) // just before parking; a cancel either way ends the wait
				waitErr = w.Wait(ctx)
				return nil
			})
			sched.Go(ctx, func(ctx context.Context) error {
				close(armed) // runs once main has armed its timer and parked
				return nil
			})
			err := sched.Sleep(ctx, time.Second)
			slept = sched.Now(ctx).Sub(start)
			return err
		}, sched.WithClock(mock))
	}()
	<-armed
	mock.Add(time.Second)
	<-parked
	cancel()
	require.NoError(t, <-done)
	assert.Equal(t, time.Second, slept)
	assert.ErrorIs(t, waitErr, context.Canceled)
}

func TestPanicEndsRunNamingTheFiber(t *testing.T) {
	var otherDeferRan bool
	err := runV(func(ctx context.Context) error {
		sched.Go(ctx, func(ctx context.Context) error {
			defer func() { otherDeferRan = true }()
			return sched.Sleep(ctx, time.Hour)
		})
		sched.Go(ctx, func(ctx context.Context) error {
			_ = sched.Sleep(ctx, time.Second)
			panic(errors.New("boom"))
		})
		return sched.Sleep(ctx, time.Hour)
	})
	var pe *sched.PanicError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, uint64(3), pe.Fiber)
	assert.Contains(t, pe.Func, "TestPanicEndsRunNamingTheFiber")
	assert.EqualError(t, errors.Unwrap(pe), "boom")
	assert.Contains(t, string(pe.Stack), "sched_test.go")
	assert.Contains(t, err.Error(), "sched: fiber 3 (")
	assert.True(t, otherDeferRan, "other fibers are stopped with their defers run")
}

// runtime.Goexit in a fiber (what t.Fatal does) ends the goroutine that
// called Run, after every fiber has been stopped: no wedge, no leak.
func TestGoexitInAFiberEndsRunsGoroutine(t *testing.T) {
	done := make(chan struct{})
	var deferRan, after atomic.Bool
	go func() {
		defer close(done)
		_ = runV(func(ctx context.Context) error {
			sched.Go(ctx, func(ctx context.Context) error {
				defer deferRan.Store(true)
				return sched.Sleep(ctx, time.Hour)
			})
			_ = sched.Sleep(ctx, time.Second)
			runtime.Goexit()
			return nil
		})
		after.Store(true)
	}()
	<-done
	assert.True(t, deferRan.Load())
	assert.False(t, after.Load(), "Run returned instead of the goroutine exiting")
}

// t.SkipNow inside a fiber ends the subtest as it would on the test
// goroutine (SkipNow, like FailNow, is runtime.Goexit): the subtest reports
// skipped, not wedged and not failed, and no code after Run executes.
func TestSkipNowInsideAFiberEndsTheSubtest(t *testing.T) {
	reached := false
	ok := t.Run("skip-in-fiber", func(t *testing.T) {
		_ = runV(func(ctx context.Context) error {
			sched.Go(ctx, func(ctx context.Context) error { return sched.Sleep(ctx, time.Hour) })
			_ = sched.Sleep(ctx, time.Second)
			t.Skip("SkipNow from inside a fiber ends the subtest cleanly")
			return nil
		})
		reached = true
	})
	assert.True(t, ok)
	assert.False(t, reached)
}

func TestUnwaitedFiberErrorsReachRun(t *testing.T) {
	errA := errors.New("a failed")
	err := runV(func(ctx context.Context) error {
		sched.Go(ctx, func(ctx context.Context) error { return errA })
		waited := sched.Go(ctx, func(ctx context.Context) error { return errors.New("collected") })
		assert.EqualError(t, waited.Wait(ctx), "collected")
		return nil
	})
	require.ErrorIs(t, err, errA)
	assert.NotContains(t, err.Error(), "collected")

	mainErr := errors.New("main failed")
	require.Equal(t, mainErr, runV(func(ctx context.Context) error { return mainErr }))
}

func TestRunContextCancelReachesFibers(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	err := sched.Run(parent, func(ctx context.Context) error {
		sched.Go(ctx, func(ctx context.Context) error {
			_ = sched.Sleep(ctx, time.Second)
			cancel()
			return nil
		})
		return sched.Sleep(ctx, time.Hour)
	}, sched.Virtual(time.Time{}))
	require.ErrorIs(t, err, context.Canceled)
}

// Grant versus cancel, many times over, from plain goroutines and fibers:
// exactly one side wins each race, the loser learns it, and nothing is lost.
func TestWakeVersusCancelNeverLosesAGrant(t *testing.T) {
	const rounds = 2000
	var granted, received, refunded atomic.Int64
	race := func(ctx context.Context, mode string) {
		cctx, cancel := context.WithCancel(ctx)
		w := &sched.Waiter{Reason: mode}
		w.OnCancel = func() { refunded.Add(1) }
		w.Prepare(cctx)
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			if w.Wake() {
				granted.Add(1)
			}
		}()
		go func() {
			defer wg.Done()
			cancel()
		}()
		if w.Wait(cctx) == nil {
			received.Add(1)
		}
		// The waker counts its success after Wake returns, which may be
		// after the waiter has already resumed: wait for both racers.
		wg.Wait()
		cancel()
	}
	for i := 0; i < rounds; i++ {
		race(context.Background(), "goroutine")
	}
	require.NoError(t, sched.Run(context.Background(), func(ctx context.Context) error {
		for i := 0; i < rounds; i++ {
			race(ctx, "fiber")
		}
		return nil
	}))
	assert.Equal(t, granted.Load(), received.Load(), "every successful Wake was received")
	assert.Equal(t, int64(2*rounds), received.Load()+refunded.Load(), "every wait ended exactly once")
}

// A fiber woken from the loop runs before the waker that yields after it,
// and before a fiber started after the wake: runnable fibers run FIFO.
func TestWakesKeepFIFOOrderWithYieldAndGo(t *testing.T) {
	var tr trace
	require.NoError(t, runV(func(ctx context.Context) error {
		w := &sched.Waiter{Reason: "test"}
		d := sched.Go(ctx, func(ctx context.Context) error {
			w.Prepare(ctx)
			err := w.Wait(ctx)
			tr.add(ctx, "woken")
			return err
		})
		sched.Yield(ctx) // d parks
		require.True(t, w.Wake())
		sched.Go(ctx, func(ctx context.Context) error { tr.add(ctx, "started later"); return nil })
		sched.Yield(ctx)
		tr.add(ctx, "waker again")
		return d.Wait(ctx)
	}))
	assert.Equal(t, []string{"0s woken", "0s started later", "0s waker again"}, tr.get())
}

// When Run stops a parked fiber (here after a deadlock), its wait ends as a
// cancellation: the owner's OnCancel runs and can hand back what it held.
func TestStoppedFiberRunsOnCancel(t *testing.T) {
	cancelled := 0
	err := runV(func(ctx context.Context) error {
		w := &sched.Waiter{Reason: "stuck", OnCancel: func() { cancelled++ }}
		w.Prepare(ctx)
		return w.Wait(ctx)
	})
	var dl *sched.DeadlockError
	require.ErrorAs(t, err, &dl)
	assert.Equal(t, 1, cancelled)
}

// t.Fatal inside a fiber fails the test and ends it, as on the test
// goroutine: checked in a child process (a failing test cannot be observed
// from inside the same binary without failing it), which must fail with
// the message, promptly, and without a leak report from goleak.
func TestFatalInsideAFiberFailsTheTest(t *testing.T) {
	if os.Getenv("SLUICE_SCHED_FATAL_CHILD") == "1" {
		_ = runV(func(ctx context.Context) error {
			sched.Go(ctx, func(ctx context.Context) error { return sched.Sleep(ctx, time.Hour) })
			_ = sched.Sleep(ctx, time.Second)
			t.Fatal("fatal from inside a fiber")
			return nil
		})
		t.Error("unreachable: Run returned after t.Fatal")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestFatalInsideAFiberFailsTheTest$", "-test.count=1")
	cmd.Env = append(os.Environ(), "SLUICE_SCHED_FATAL_CHILD=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "the child must fail: %s", out)
	assert.Contains(t, string(out), "fatal from inside a fiber")
	assert.Contains(t, string(out), "--- FAIL: TestFatalInsideAFiberFailsTheTest")
	assert.NotContains(t, string(out), "unreachable")
	assert.NotContains(t, string(out), "found unexpected goroutines", "fibers leaked")
}
