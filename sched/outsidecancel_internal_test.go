package sched

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/vclock"
)

// A cancel from another goroutine ends the waits on a context in steps:
// the context is done first (context.WithCancel's cancel closes it, then
// tells its parent's AfterFunc registration; a loop context records its
// error, then ends its waits and runs its callbacks), then this package's
// code ends each wait (a compare-and-swap of the Waiter's state, its
// OnCancel) or runs each sched.AfterFunc callback, which may wake a fiber,
// and only then does the fiber's wake reach the loop's inbox. A loop that
// goes idle in between sees no timer, no wake and no Blocking call; the
// wake on its way must still land, so the loop must wait for it, not
// report a deadlock (nor, after jumping to the next timer, a deadlock "at
// +1h"). The outside goroutine is held in that window from the loop's
// first idle look until every goroutine of the bubble is blocked, at:
//
//   - "wake committed": inside the Waiter's OnCancel, after the state's
//     compare-and-swap and before the wake reaches the inbox;
//   - "cancel begun": in a sched.AfterFunc registered on the context
//     before the wait, which the cancel of a standard context runs first:
//     the context is done and the fiber's wait not ended yet;
//   - "callback wakes": in a sched.AfterFunc whose callback then wakes
//     the fiber, which waits on the loop's own context, not on the
//     cancelled one.
//
// for a standard context (context.WithCancel(ctx)) and a loop context
// (sched.WithTimeout(ctx, 24h)) cancelled by their cancel functions. The
// loop must then be asleep, and the waiting fiber end once the outside
// goroutine goes on.
func TestOutsideCancelInFlightIsNoDeadlock(t *testing.T) {
	type kind struct {
		name string
		make func(ctx context.Context) (context.Context, context.CancelFunc)
	}
	std := kind{"standard", func(ctx context.Context) (context.Context, context.CancelFunc) {
		return context.WithCancel(ctx)
	}}
	lp := kind{"loop", func(ctx context.Context) (context.Context, context.CancelFunc) {
		return WithTimeout(ctx, 24*time.Hour)
	}}
	for _, c := range []struct {
		kind kind
		hold string
	}{
		{std, "wake committed"}, {std, "cancel begun"}, {std, "callback wakes"},
		{lp, "wake committed"}, {lp, "callback wakes"},
	} {
		t.Run(c.kind.name+"/"+c.hold, func(t *testing.T) {
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
						cctx, cancel := c.kind.make(ctx)
						defer cancel()
						w := &Waiter{Reason: "outside cancel"}
						wctx := cctx // the context of w's wait
						switch c.hold {
						case "wake committed":
							w.OnCancel = holdOnce
						case "cancel begun":
							AfterFunc(cctx, holdOnce)
						case "callback wakes":
							wctx = ctx
							AfterFunc(cctx, func() {
								holdOnce()
								w.Wake()
							})
						}
						waiter := Go(ctx, func(ctx context.Context) error {
							w.Prepare(wctx)
							if err := w.Wait(wctx); err != nil {
								return err
							}
							return cctx.Err() // woken by the callback
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
