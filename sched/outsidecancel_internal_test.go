package sched

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/vclock"
)

// A cancel from another goroutine of a standard context over a loop
// context (context.WithCancel(ctx) in a fiber) ends the wait on it on that
// goroutine, in steps: the context is done first, then this package's
// code ends each wait linked to it (a compare-and-swap of the Waiter's
// state, its OnCancel), and only then the fiber's wake reaches the loop's
// inbox. A loop that goes idle in between sees no timer, no wake and no
// Blocking call; the wake on its way must still land, so the loop must
// wait for it, not report a deadlock (nor, after jumping to the next
// timer, a deadlock "at +1h"). The outside goroutine is held in that
// window from the loop's first idle look until every goroutine of the
// bubble is blocked, at two points:
//
//   - "wake committed": inside the Waiter's OnCancel, after the state's
//     compare-and-swap and before the wake reaches the inbox;
//   - "cancel begun": in a sched.AfterFunc registered on the context
//     before the wait, which the cancel runs first: the context is done
//     and the fiber's wait not ended yet.
//
// The loop must then be asleep, and the waiting fiber end with
// context.Canceled once the outside goroutine goes on.
func TestOutsideCancelInFlightIsNoDeadlock(t *testing.T) {
	for _, hold := range []string{"wake committed", "cancel begun"} {
		t.Run(hold, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				held := make(chan struct{})    // the outside cancel is in the window
				proceed := make(chan struct{}) // it may go on
				holdOnce := func() {
					close(held)
					<-proceed
				}
				loops := make(chan *loop, 1)
				cancelled := make(chan struct{})
				done := make(chan error, 1)
				go func() {
					done <- Run(context.Background(), func(ctx context.Context) error {
						l := nearestLoop(ctx)
						loops <- l
						cctx, cancel := context.WithCancel(ctx)
						defer cancel()
						if hold == "cancel begun" {
							AfterFunc(cctx, holdOnce)
						}
						waiter := Go(ctx, func(ctx context.Context) error {
							w := &Waiter{Reason: "outside cancel"}
							if hold == "wake committed" {
								w.OnCancel = holdOnce
							}
							w.Prepare(cctx)
							return w.Wait(cctx)
						})
						started := false // loop goroutine only
						l.hookIdle = func() {
							if started {
								return
							}
							started = true
							go func() {
								defer close(cancelled)
								cancel()
							}()
							<-held
						}
						// A timer the loop fires while the cancel is held:
						// the deadlock, if reported, is "at +1h".
						if err := Sleep(ctx, time.Hour); err != nil {
							return err
						}
						return waiter.Wait(ctx)
					}, Virtual(time.Time{}))
				}()
				l := <-loops
				synctest.Wait() // the cancel is held; the loop has decided
				sleeping := l.isSleeping()
				close(proceed)
				err := <-done
				<-cancelled
				require.True(t, sleeping, "the loop did not wait for the cancel in flight; Run: %v", err)
				require.ErrorIs(t, err, context.Canceled)
			})
		})
	}
}

// A wait on a context the loop cannot link (a standard child of a wrapper
// that hides the loop context's AfterFunc) that nothing ends, with no
// ancestor ended either, is still a deadlock, reported at once.
func TestUnlinkableContextNobodyEndsIsDeadlock(t *testing.T) {
	for _, shape := range []string{"wrapper of the root", "wrapper of a standard child"} {
		t.Run(shape, func(t *testing.T) {
			err := Run(context.Background(), func(ctx context.Context) error {
				var inner context.Context = ctx
				if shape == "wrapper of a standard child" {
					c, cancel := context.WithCancel(ctx)
					defer cancel()
					inner = c
				}
				octx, ocancel := context.WithCancel(struct{ context.Context }{inner})
				defer ocancel()
				w := &Waiter{Reason: "never woken"}
				w.Prepare(octx)
				return w.Wait(octx)
			}, Virtual(time.Time{}))
			var d *DeadlockError
			require.ErrorAs(t, err, &d)
			require.Len(t, d.Parked, 1)
			require.Equal(t, "never woken", d.Parked[0].Reason)
			require.Equal(t, vclock.Epoch(), d.At)
		})
	}
}
