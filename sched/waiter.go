package sched

import (
	"context"
	"sync/atomic"
)

// The states of a waiter, in the low two bits of waiter.state; the bits
// above count uses of the waiter (its generation).
const (
	statePending   = 0
	stateWoken     = 1
	stateCancelled = 2
	stateMask      = 3
	genStep        = 4
)

// A waiter parks one caller until another party calls Wake, or until the
// caller's context ends. It is the building block of every blocking call in
// Sluice: inside a loop it parks the calling fiber, outside one it blocks the
// calling goroutine. Wake may be called from any goroutine; a wake for a
// fiber reaches its loop through the loop's inbox. The parking core under
// semaphore, ticker and ratelimiter gets its waiters through
// internal/loopctx (see newHookWaiter), so the type is not sched's API.
//
// The protocol, for a queue guarded by the owner's lock:
//
//	w.Prepare(ctx)           // bind w to the caller, before anyone can see it
//	mu.Lock(); q.push(w); mu.Unlock()
//	err := w.Wait(ctx)       // nil: woken; else ctx.Err(), and OnCancel has run
//
// and the waker, under mu, removes w from q and calls w.Wake; if Wake
// returns false the wait was cancelled first and the waker moves on. Exactly
// one of Wake and cancellation wins, so a grant is never lost: OnCancel runs
// (on the cancelling goroutine, before the waiting caller resumes) only when
// cancellation won, and it must take w out of the owner's queue and pass on
// anything w was holding.
//
// The zero value is ready for Prepare. A waiter may be reused once Wait has
// returned and nobody else refers to it. It must not be copied after first use.
type waiter struct {
	ctxNode node // in ctx.waiters, guarded by ctx.mu; first, see list

	// What a wait and its wake touch, next to each other (see Fiber).
	state atomic.Uint64
	// Bound by Prepare.
	l  *loop
	f  *Fiber
	ch chan struct{} // goroutine mode: one send per Wake; made anew by each Prepare

	// Reason says what the caller waits for, as shown in a DeadlockError
	// (for example "semaphore.Acquire"). N, if non-zero, is shown as " n=N".
	Reason string
	N      int64
	// OnCancel, if set, runs once when cancellation wins over Wake, before
	// the waiting caller resumes; also when Run stops a fiber parked in
	// Wait (a deadlock, a panic, a daemon that ignored its cancellation).
	// It may run on any goroutine, and must not wait for the waiting caller.
	OnCancel func()

	// Registration with a loop context, guarded by that context's mu.
	ctx *loopCtx

	// The context of the wait in progress when it can end, set by Wait
	// on the loop's goroutine while the fiber is parked in it, nil
	// otherwise. Why: an idle loop about to report a deadlock looks at it
	// (see loop.awaitParked); a context ended, or ending, means a wake is
	// on its way from the goroutine that ends it. Last: a wake never
	// touches it.
	waitCtx context.Context
}

type waiterGen struct {
	w   *waiter
	gen uint64
}

// Prepare binds w to the caller that will Wait on ctx (the current fiber
// when ctx belongs to a loop, else the calling goroutine) and readies it for
// one wait. Call it before publishing w to any waker.
//
// Outside a loop every Prepare makes a new channel for the wait (one small
// allocation), never reusing the last one: a waiter pooled across
// testing/synctest bubbles must not carry a channel made in one bubble into
// another or out of it. Inside a loop a wait allocates nothing.
//
// It panics when ctx belongs to a loop but the loop runs no fiber: the
// loop's context used from a goroutine of its own (see the package doc).
func (w *waiter) Prepare(ctx context.Context) {
	// A new generation: late cancellations of the previous use fail.
	s := w.state.Load()
	w.state.Store((s &^ stateMask) + genStep)
	w.l, w.f, w.ch = nil, nil, nil
	if l := nearestLoop(ctx); l != nil {
		// running, not current: this may be a goroutine off the loop, and
		// the check must not race with the loop switching fibers.
		f := l.running.Load()
		if f == nil {
			panic("sched: a loop's context used to wait outside the loop's fibers")
		}
		w.l, w.f = l, f
		return
	}
	w.ch = make(chan struct{}, 1)
}

func (w *waiter) gen() uint64 { return w.state.Load() &^ stateMask }

// Wake ends the wait with success. It reports whether it did; false means the
// wait had been cancelled (or already woken) and the caller keeps whatever it
// meant to grant. Safe to call from any goroutine.
func (w *waiter) Wake() bool {
	for {
		s := w.state.Load()
		if s&stateMask != statePending {
			return false
		}
		if w.state.CompareAndSwap(s, s|stateWoken) {
			w.resume()
			return true
		}
	}
}

// tryCancel ends the wait of generation gen as cancelled if it is still
// pending, and then runs OnCancel. It reports whether it did; false means
// Wake won (or gen is an earlier use of w) and nothing was done. This one
// compare-and-swap is what makes exactly one of Wake and cancellation win,
// and it carries the generation so a late cancel of an earlier use fails.
// The caller resumes the waiting caller if that is someone else (cancelGen);
// a caller cancelling its own wait just returns.
func (w *waiter) tryCancel(gen uint64) bool {
	if !w.state.CompareAndSwap(gen|statePending, gen|stateCancelled) {
		return false
	}
	if w.OnCancel != nil {
		w.OnCancel()
	}
	return true
}

// cancelGen cancels the wait of generation gen if it is still pending, and
// lets the waiting caller go on.
func (w *waiter) cancelGen(gen uint64) {
	if w.tryCancel(gen) {
		w.resume()
	}
}

// resume lets the waiting caller go on, after exactly one state transition.
func (w *waiter) resume() {
	if w.f != nil {
		w.l.ready(w.f)
		return
	}
	w.ch <- struct{}{}
}

// Wait blocks until w is woken (nil) or ctx ends (ctx.Err(), after
// OnCancel). A ctx already done when Wait starts fails at once without
// parking, unless a Wake came first. Inside a loop, the fiber parks and other
// fibers run; the cancellation is seen at the exact (virtual) instant the
// context ends.
func (w *waiter) Wait(ctx context.Context) error {
	if w.f == nil {
		return w.waitGoroutine(ctx)
	}
	gen := w.gen()
	done := ctx.Done()
	var (
		watched *watch   // the watch on a standard context
		reg     *loopCtx // the loop context w registered with
	)
	if done != nil {
		if ctx.Err() != nil {
			if w.tryCancel(gen) {
				return ctx.Err()
			}
			// Woken first: the wake has queued us; take that turn below.
		} else if c := nearestLoopCtx(ctx); c != nil {
			if c.addWaiter(w) {
				if !c.neverDone {
					reg = c // neverDone: nothing was registered
				}
			} else {
				w.cancelGen(gen) // ended just now
			}
		} else {
			// A context of another kind (context.WithCancel over a loop
			// context, say): the loop ends this wait at the first
			// scheduling decision after ctx is done (see loop.watch).
			watched = w.l.watch(ctx, func() { w.cancelGen(gen) })
		}
		w.waitCtx = ctx
	}
	w.l.park(w.f, w)
	w.waitCtx = nil
	if watched != nil {
		w.l.unwatch(watched)
	} else if reg != nil {
		// Not w.ctx: a cancel on another goroutine may be clearing it;
		// removeWaiter checks it under the context's lock.
		reg.removeWaiter(w)
	}
	if w.state.Load()&stateMask == stateWoken {
		return nil
	}
	return ctx.Err()
}

func (w *waiter) waitGoroutine(ctx context.Context) error {
	done := ctx.Done()
	if done == nil {
		<-w.ch
		return nil
	}
	gen := w.gen()
	select {
	case <-w.ch:
		return nil
	case <-done:
		if w.tryCancel(gen) {
			return ctx.Err()
		}
		<-w.ch // Wake won the race; its send is on the way
		return nil
	}
}
