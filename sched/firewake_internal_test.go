package sched

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/vwake"
	"github.com/sluice-go/sluice/vclock"
)

// wakerFunc is a vwake.Waker that calls itself.
type wakerFunc func()

func (f wakerFunc) Wake() bool { f(); return true }

// A goroutine that advances a WithVirtualClock clock from outside the loop
// takes a due timer off the clock's queue, and only then, with the clock's
// lock released, runs its callback or wakes its Waiter (Sleep's timers). A
// loop that goes idle in between sees no timer, no wake in its inbox and no
// Blocking call; the fire in flight can still wake its fiber, so the loop
// must wait for it rather than report a deadlock, and look again once the
// fire has ended: run on if it woke the fiber, report the deadlock if it
// woke nobody (the loop then has only the fire's end to wake it). The
// outside goroutine is held in that window, in the timer's callback or in
// a bound Waker as Sleep's timers have, from the loop's first idle look
// until every goroutine of the bubble is blocked: the loop must be asleep
// then, not returned with a DeadlockError. A loop that never woke after
// the fire would leave the bubble deadlocked, which synctest reports.
func TestOutsideFireInFlightIsNoDeadlock(t *testing.T) {
	for _, arm := range []struct {
		name string
		arm  func(vc *vclock.Clock, fire func())
	}{
		{"callback", func(vc *vclock.Clock, fire func()) { vc.AfterFunc(time.Second, fire) }},
		{"waker", func(vc *vclock.Clock, fire func()) {
			tm := new(vclock.Timer)
			vwake.Bind(tm, vc, wakerFunc(fire))
			tm.Reset(time.Second)
		}},
	} {
		for _, wakes := range []bool{true, false} {
			name := arm.name + "-wakes"
			if !wakes {
				name = arm.name + "-wakes-nobody"
			}
			t.Run(name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					vc := vclock.New(time.Time{})
					var w Waiter
					advance := make(chan struct{}) // the outside goroutine may advance the clock
					taken := make(chan struct{})   // it has taken the timer and not woken the fiber yet
					proceed := make(chan struct{}) // it may end the fire
					arm.arm(vc, func() {
						close(taken)
						<-proceed
						if wakes {
							w.Wake()
						}
					})
					outside := make(chan struct{})
					go func() {
						defer close(outside)
						<-advance
						vc.Advance(time.Second)
					}()
					loops := make(chan *loop, 1)
					done := make(chan error, 1)
					go func() {
						done <- Run(context.Background(), func(ctx context.Context) error {
							l := nearestLoop(ctx)
							loops <- l
							started := false // loop goroutine only
							l.hookIdle = func() {
								if started {
									return
								}
								started = true
								close(advance)
								<-taken
							}
							w.Reason = "woken by the outside fire"
							w.Prepare(ctx)
							return w.Wait(ctx)
						}, WithVirtualClock(vc))
					}()
					l := <-loops
					synctest.Wait() // the fire is held; the loop has decided
					sleeping := l.isSleeping()
					close(proceed)
					err := <-done
					<-outside
					require.True(t, sleeping, "the loop did not wait for the fire in flight; Run: %v", err)
					if wakes {
						require.NoError(t, err)
					} else {
						var d *DeadlockError
						require.ErrorAs(t, err, &d)
						require.Len(t, d.Parked, 1)
						require.Equal(t, "woken by the outside fire", d.Parked[0].Reason)
					}
					require.Equal(t, vclock.Epoch().Add(time.Second), vc.Now())
				})
			})
		}
	}
}

// isSleeping reports whether the loop is blocked waiting for the outside.
func (l *loop) isSleeping() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sleeping
}

// A fire from outside the loop may end a wait without the inbox: its
// callback cancels a standard context that a fiber waits on, one the loop
// settles at its next decision (a child of a child of a loop context; see
// watch). When that fire ends after the decision's settle and before the
// loop's last look for anything that can wake its fibers, the loop must
// settle again before reporting a deadlock. The outside goroutine runs the
// whole fire from the loop's first idle look.
func TestOutsideFireEndingWatchedContextIsNoDeadlock(t *testing.T) {
	vc := vclock.New(time.Time{})
	advance := make(chan struct{})
	outside := make(chan struct{})
	var cancel context.CancelFunc
	vc.AfterFunc(time.Second, func() { cancel() })
	go func() {
		defer close(outside)
		<-advance
		vc.Advance(time.Second)
	}()
	err := Run(context.Background(), func(ctx context.Context) error {
		c1, cancel1 := context.WithCancel(ctx)
		defer cancel1()
		var c2 context.Context
		c2, cancel = context.WithCancel(c1)
		started := false
		nearestLoop(ctx).hookIdle = func() {
			if started {
				return
			}
			started = true
			close(advance)
			<-outside // the fire has ended: the timer gone, c2 cancelled
		}
		var w Waiter
		w.Prepare(c2)
		if err := w.Wait(c2); err != context.Canceled {
			return fmt.Errorf("wait ended with %v, want context.Canceled", err)
		}
		return nil
	}, WithVirtualClock(vc))
	<-outside
	require.NoError(t, err)
}
