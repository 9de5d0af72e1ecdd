package sched_test

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/sched"
	"github.com/sluice-go/sluice/vclock"
)

// Wakes from three places at once, under -race: Sleep timers fired by the
// idle loop itself, the same timers fired by a goroutine that advances the
// WithVirtualClock clock from outside (their wakes reach the loop through
// its inbox), and plain goroutines waking fibers' Waiters. Every Sleep ends
// exactly once and never before its duration has passed, every outside
// wake arrives, and the run ends cleanly.
func TestLoopFiredAndOutsideWakesMix(t *testing.T) {
	const (
		sleepers, sleeps = 64, 40
		waiters, rounds  = 8, 40
	)
	vc := vclock.New(time.Time{})
	// A timer always armed that only the loop fires: when a Waiter's Wake
	// from the plain goroutine below is still on its way, the idle loop
	// fires this one meanwhile instead of reporting a deadlock (a report
	// that Wake would make false a moment later: the loop cannot know of
	// a goroutine that is not a Blocking call). A timer the outside
	// goroutine is firing needs no keeper (see
	// TestOutsideAdvanceOfLastTimersIsNoDeadlock); without this one, the
	// reports name only the Waiters' fibers. Re-armed a second ahead each
	// time; keeperAt is its deadline, which the outside steps never reach.
	var keeperAt atomic.Int64
	var keeper *vclock.Timer
	keeperAt.Store(int64(time.Second))
	keeper = vc.AfterFunc(time.Second, func() {
		keeperAt.Store(int64(vc.Since(vclock.Epoch()) + time.Second))
		keeper.Reset(time.Second)
	})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // advances the loop's clock from outside, in small steps
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			limit := vclock.Epoch().Add(time.Duration(keeperAt.Load()) - 1)
			to := vc.Now().Add(time.Duration(i%5) * 30 * time.Microsecond)
			if to.After(limit) {
				to = limit
			}
			vc.AdvanceTo(to)
			runtime.Gosched()
		}
	}()
	wakes := make(chan *sched.Waiter, waiters)
	wg.Add(1)
	go func() { // wakes fibers' Waiters from outside the loop
		defer wg.Done()
		for w := range wakes {
			runtime.Gosched()
			w.Wake()
		}
	}()
	var slept, woken atomic.Int64
	err := sched.Run(context.Background(), func(ctx context.Context) error {
		var fs []*sched.Fiber
		for j := range sleepers {
			d := time.Duration(j%7+1) * 100 * time.Microsecond
			fs = append(fs, sched.Go(ctx, func(ctx context.Context) error {
				for range sleeps {
					start := sched.Now(ctx)
					if err := sched.Sleep(ctx, d); err != nil {
						return err
					}
					if got := sched.Now(ctx).Sub(start); got < d {
						t.Errorf("slept %v of %v", got, d)
					}
					slept.Add(1)
				}
				return nil
			}))
		}
		for range waiters {
			fs = append(fs, sched.Go(ctx, func(ctx context.Context) error {
				var w sched.Waiter
				for range rounds {
					w.Prepare(ctx)
					wakes <- &w // never blocks: one wait in flight per fiber
					if err := w.Wait(ctx); err != nil {
						return err
					}
					woken.Add(1)
				}
				return nil
			}))
		}
		for _, f := range fs {
			if err := f.Wait(ctx); err != nil {
				return err
			}
		}
		return nil
	}, sched.WithVirtualClock(vc))
	close(stop)
	close(wakes)
	wg.Wait()
	require.NoError(t, err)
	assert.Equal(t, int64(sleepers*sleeps), slept.Load())
	assert.Equal(t, int64(waiters*rounds), woken.Load())
}

// Fibers that only sleep, on a WithVirtualClock clock that a goroutine
// advances from outside in small steps while the loop fires the same
// timers itself, with nothing else armed: whenever the outside goroutine
// has taken the last armed timer and not yet woken its fiber, the idle
// loop must wait for that wake, not report a deadlock. Unlike the test
// above, no keeper timer hides the race: many short runs, each ending
// with a few fibers asleep on the last timers, so that the outside
// goroutine often holds the last one as the loop looks; no run may report
// a DeadlockError.
func TestOutsideAdvanceOfLastTimersIsNoDeadlock(t *testing.T) {
	const runs, sleepers, sleeps = 500, 4, 20
	for run := range runs {
		vc := vclock.New(time.Time{})
		stop := make(chan struct{})
		outside := make(chan struct{})
		go func() {
			defer close(outside)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				vc.Advance(time.Duration(i%3) * 50 * time.Microsecond)
				runtime.Gosched()
			}
		}()
		var slept atomic.Int64
		err := sched.Run(context.Background(), func(ctx context.Context) error {
			for j := range sleepers {
				d := time.Duration(j+1) * 100 * time.Microsecond
				sched.Go(ctx, func(ctx context.Context) error {
					for range sleeps {
						if err := sched.Sleep(ctx, d); err != nil {
							return err
						}
						slept.Add(1)
					}
					return nil
				})
			}
			return nil
		}, sched.WithVirtualClock(vc))
		close(stop)
		<-outside
		require.NoError(t, err, "run %d", run)
		require.Equal(t, int64(sleepers*sleeps), slept.Load(), "run %d", run)
	}
}
