package sched

import (
	"context"
	"runtime"
	"testing"
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
// must wait for it rather than report a deadlock. The outside goroutine is
// held in that window, in the timer's callback or in a bound Waker as
// Sleep's timers have, from the loop's first idle look until the loop is
// asleep (fixed) or Run has returned (the false DeadlockError).
func TestOutsideFireInFlightIsNoDeadlock(t *testing.T) {
	for _, tc := range []struct {
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
		t.Run(tc.name, func(t *testing.T) {
			vc := vclock.New(time.Time{})
			var w Waiter
			advance := make(chan struct{}) // the outside goroutine may advance the clock
			taken := make(chan struct{})   // it has taken the timer and not woken the fiber yet
			proceed := make(chan struct{}) // it may wake the fiber
			tc.arm(vc, func() {
				close(taken)
				<-proceed
				w.Wake()
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
			released := false
			var err error
			for finished := false; !finished; {
				select {
				case err = <-done:
					finished = true
				default:
					if !released && l.isSleeping() {
						released = true
						close(proceed)
					}
					runtime.Gosched()
				}
			}
			if !released {
				close(proceed)
			}
			<-outside
			require.NoError(t, err)
			require.Equal(t, vclock.Epoch().Add(time.Second), vc.Now())
		})
	}
}

// isSleeping reports whether the loop is blocked waiting for the outside.
func (l *loop) isSleeping() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sleeping
}
