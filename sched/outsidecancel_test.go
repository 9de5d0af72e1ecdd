package sched_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/sched"
	"github.com/sluice-go/sluice/vclock"
)

// hidden is the common wrapper a loop cannot see through: it forwards the
// four Context methods and hides every other, AfterFunc included, so a
// standard child of it learns of its end only on a goroutine the standard
// library starts for that.
type hidden struct{ context.Context }

// A wait on a standard child of a wrapped sched.WithTimeout context ends
// when the timeout does, at its virtual deadline, under every seed: the
// loop's timer ends the inner context at +1s, the standard library's
// goroutine carries that to the child, and the loop waits for it rather
// than report a deadlock (nothing else is armed) or jump to the next timer
// (another fiber sleeps an hour). Shapes: the child itself; a standard
// child of that child; a sched.WithTimeout over the child (a loop context
// whose parent the loop must watch); Sleep and a bare Waiter waiting on
// each.
func TestWrappedTimeoutWakesItsWaiterAtItsDeadline(t *testing.T) {
	shapes := []struct {
		name string
		make func(ctx context.Context) (context.Context, func())
	}{
		{"WithCancel(hidden)", func(ctx context.Context) (context.Context, func()) {
			return context.WithCancel(hidden{ctx})
		}},
		{"WithCancel(WithCancel(hidden))", func(ctx context.Context) (context.Context, func()) {
			c1, cancel1 := context.WithCancel(hidden{ctx})
			c2, cancel2 := context.WithCancel(c1)
			return c2, func() { cancel2(); cancel1() }
		}},
		{"sched.WithTimeout(WithCancel(hidden))", func(ctx context.Context) (context.Context, func()) {
			c1, cancel1 := context.WithCancel(hidden{ctx})
			c2, cancel2 := sched.WithTimeout(c1, 2*time.Hour)
			return c2, func() { cancel2(); cancel1() }
		}},
	}
	waits := []struct {
		name string
		wait func(ctx context.Context) error
	}{
		{"Sleep", func(ctx context.Context) error { return sched.Sleep(ctx, time.Hour) }},
		{"Waiter", func(ctx context.Context) error {
			w := &sched.Waiter{Reason: "woken by nobody"}
			w.Prepare(ctx)
			return w.Wait(ctx)
		}},
	}
	for _, shape := range shapes {
		for _, wait := range waits {
			for _, other := range []bool{false, true} {
				name := shape.name + "/" + wait.name
				if other {
					name += "/another-timer"
				}
				t.Run(name, func(t *testing.T) {
					for seed := range uint64(20) {
						var woke time.Duration
						err := sched.Run(context.Background(), func(ctx context.Context) error {
							if other {
								sched.Go(ctx, func(ctx context.Context) error {
									return sched.Sleep(ctx, 3*time.Hour)
								})
							}
							tctx, tcancel := sched.WithTimeout(ctx, time.Second)
							defer tcancel()
							wctx, cancel := shape.make(tctx)
							defer cancel()
							err := wait.wait(wctx)
							woke = since(ctx)
							return err
						}, sched.Virtual(time.Time{}), sched.WithSeed(seed))
						require.ErrorIs(t, err, context.DeadlineExceeded, "seed %d", seed)
						require.Equal(t, time.Second, woke, "seed %d", seed)
					}
				})
			}
		}
	}
}

// A fiber waits on context.WithCancel(ctx) that another goroutine cancels,
// many times over, so that the cancel lands in every state of the loop,
// idle and about to fire a timer or report a deadlock included. Whatever
// the interleaving, the wait ends and Run never returns a DeadlockError:
//
//   - "issue shape": main sleeps an hour on the context right after
//     starting the goroutine; the sleep ends by the cancel
//     (context.Canceled) or by its timer (nil: the cancel had not begun
//     when the loop fired it).
//   - "after Done": a fiber waits (Sleep, or a queue's Waiter whose
//     OnCancel does some work between the cancel's decision and the wake),
//     and main waits in Blocking until the context is done, then joins it:
//     the cancel has begun by the time the loop goes idle, so the queue's
//     wait must end with context.Canceled (Sleep's may still end by its
//     timer at +1h, if the loop fired it before the cancel reached the
//     Waiter). A Waiter whose OnCancel yields the cancelling goroutine
//     holds the window open longest.
func TestOutsideCancelNeverDeadlocks(t *testing.T) {
	const runs = 2000
	waits := []struct {
		name string
		wait func(ctx context.Context) error
	}{
		{"Sleep", func(ctx context.Context) error { return sched.Sleep(ctx, time.Hour) }},
		{"queue", func(ctx context.Context) error {
			var q waitQueue
			return q.wait(ctx)
		}},
		{"yielding OnCancel", func(ctx context.Context) error {
			w := &sched.Waiter{Reason: "yielding OnCancel", OnCancel: runtime.Gosched}
			w.Prepare(ctx)
			return w.Wait(ctx)
		}},
	}
	check := func(t *testing.T, run int, err error, timerMayWin bool) {
		var d *sched.DeadlockError
		if errors.As(err, &d) {
			require.FailNow(t, "false deadlock", "run %d: %v", run, err)
		}
		if err != nil || !timerMayWin {
			require.ErrorIs(t, err, context.Canceled, "run %d", run)
		}
	}
	t.Run("issue shape", func(t *testing.T) {
		for run := range runs {
			var wg sync.WaitGroup
			err := sched.Run(context.Background(), func(ctx context.Context) error {
				cctx, cancel := context.WithCancel(ctx)
				defer cancel()
				wg.Add(1)
				go func() {
					defer wg.Done()
					cancel()
				}()
				return sched.Sleep(cctx, time.Hour)
			}, sched.Virtual(time.Time{}))
			wg.Wait()
			check(t, run, err, true)
		}
	})
	for _, wait := range waits {
		t.Run("after Done/"+wait.name, func(t *testing.T) {
			for run := range runs {
				var wg sync.WaitGroup
				err := sched.Run(context.Background(), func(ctx context.Context) error {
					cctx, cancel := context.WithCancel(ctx)
					defer cancel()
					f := sched.Go(ctx, func(context.Context) error { return wait.wait(cctx) })
					sched.Yield(ctx) // f parks
					wg.Add(1)
					go func() {
						defer wg.Done()
						cancel()
					}()
					_ = sched.Blocking(ctx, func() error { <-cctx.Done(); return nil })
					return f.Wait(ctx)
				}, sched.Virtual(time.Time{}))
				wg.Wait()
				check(t, run, err, wait.name == "Sleep")
			}
		})
	}
}

// Example-sized check of the message: a real deadlock under a wrapper
// still names the fiber and the time.
func TestWrappedContextRealDeadlockIsReported(t *testing.T) {
	err := runV(func(ctx context.Context) error {
		require.NoError(t, sched.Sleep(ctx, time.Minute))
		octx, cancel := context.WithCancel(hidden{ctx})
		defer cancel()
		w := &sched.Waiter{Reason: "nobody"}
		w.Prepare(octx)
		return w.Wait(octx)
	})
	var d *sched.DeadlockError
	require.ErrorAs(t, err, &d)
	require.Equal(t, vclock.Epoch().Add(time.Minute), d.At)
	require.Contains(t, err.Error(), fmt.Sprintf("fiber %d waits on nobody", 1))
}
