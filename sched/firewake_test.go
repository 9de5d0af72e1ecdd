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
	// A timer always armed that only the loop fires: when the outside
	// goroutine has taken the last other timer and not yet woken its
	// fiber, or a Waiter's Wake is still on its way, the idle loop fires
	// this one meanwhile instead of reporting a deadlock (a report the
	// outside goroutine would make false a moment later). Re-armed a
	// second ahead each time; keeperAt is its deadline, which the outside
	// steps never reach.
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
