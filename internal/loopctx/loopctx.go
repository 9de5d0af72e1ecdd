// Package loopctx is what this module's blocking packages (ratelimiter,
// ticker, the parking core under them and semaphore, httplimittest) ask of
// a caller's context about the sched.Run loop it may belong to: its clock,
// whether it belongs to a loop at all, the end of that loop's run, and a
// Waiter that parks the caller (the fiber in a loop, else the goroutine).
// The answers are sched's, filled in by sched's init: a program without
// sched has no loops, and then every context belongs to none. Internal, so
// that this machinery is not part of sched's API and can change with it.
package loopctx

import (
	"context"
	"time"

	"github.com/benbjohnson/clock"
)

// A Clock is a time source for waits: the loop's clock (virtual or real)
// inside a loop, a clock.Clock outside one. Timer callbacks may run on any
// goroutine (a virtual clock's run on the goroutine that advances it); they
// must not block.
type Clock interface {
	Now() time.Time
	AfterFunc(d time.Duration, f func()) Timer
}

// A Timer is a callback armed on a Clock.
type Timer interface {
	// Stop disarms the timer, reporting whether it was armed.
	Stop() bool
	// Reset re-arms the timer for d from now, reporting whether it was armed.
	Reset(d time.Duration) bool
}

// Answers are sched's side of the functions below.
type Answers struct {
	// Clock returns the clock of ctx's loop, nil when ctx belongs to none.
	Clock func(ctx context.Context) Clock
	// AfterRun is AfterRun for a ctx that belongs to a loop.
	AfterRun func(ctx context.Context, f func()) (stop func() bool)
	// NewWaiter is NewWaiter.
	NewWaiter func(onCancel func()) Waiter
}

// A Waiter parks one caller until another party calls Wake, or until the
// caller's context ends: inside a loop it parks the calling fiber, outside
// one it blocks the calling goroutine. The protocol, for a queue guarded by
// the owner's lock:
//
//	w.Prepare(ctx, reason, n) // bind w to the caller, before anyone can see it
//	mu.Lock(); q.push(w); mu.Unlock()
//	err := w.Wait(ctx)        // nil: woken; else ctx.Err(), and onCancel has run
//
// and the waker, under mu, removes w from q and calls w.Wake; if Wake
// returns false the wait was cancelled first and the waker moves on.
// Exactly one of Wake and cancellation wins, so a grant is never lost:
// onCancel runs (on the cancelling goroutine, before the waiting caller
// resumes; also when Run stops a fiber parked in Wait) only when
// cancellation won, and it must take w out of the owner's queue and pass on
// anything w was holding. It must not wait for the waiting caller.
//
// reason and n say what the caller waits for, as a sched.DeadlockError
// shows it ("semaphore.Acquire n=3"; n 0 is not shown). Wake may be called
// from any goroutine. A Waiter may be reused once Wait has returned and
// nobody else refers to it; outside a loop each Prepare makes a new channel,
// so a pooled Waiter never carries one from a testing/synctest bubble to
// another. Prepare panics when ctx belongs to a loop that runs no fiber (a
// loop's context used from a goroutine of its own).
type Waiter interface {
	Prepare(ctx context.Context, reason string, n int64)
	Wait(ctx context.Context) error
	Wake() bool
}

// NewWaiter returns a Waiter whose cancellation runs onCancel. It panics in
// a program without sched: a package that parks callers imports sched (for
// its side effect at least) so that its init installs the answers.
func NewWaiter(onCancel func()) Waiter {
	if answers.NewWaiter == nil {
		panic("loopctx: NewWaiter without sched in the program")
	}
	return answers.NewWaiter(onCancel)
}

var answers Answers

// Install sets the answers; sched calls it once, from its init.
func Install(a Answers) { answers = a }

// ClockOf returns ctx's clock: its loop's clock when ctx belongs to a loop,
// else fallback (real time when fallback is nil).
func ClockOf(ctx context.Context, fallback clock.Clock) Clock {
	if c := loopClock(ctx); c != nil {
		return c
	}
	if fallback == nil {
		fallback = clock.New()
	}
	return Real(fallback)
}

func loopClock(ctx context.Context) Clock {
	if answers.Clock == nil {
		return nil // sched is not in the program: no loops
	}
	return answers.Clock(ctx)
}

// InLoop reports whether ctx belongs to a run loop: whether it is a context
// of a fiber, or derived from one through any wrapper (context.WithValue,
// WithCancel, WithTimeout, …). Waits that take such a ctx park the fiber and
// use the loop's clock. It is the one place other packages ask.
func InLoop(ctx context.Context) bool { return loopClock(ctx) != nil }

// AfterRun arranges to call f once when the Run that ctx belongs to (through
// any wrapper) has ended, on the goroutine that called Run, after every
// fiber has stopped; at once if that run has already ended. It returns a
// function that unregisters f and reports whether it did so before f
// started, or nil when ctx belongs to no loop.
//
// Only the end of the run counts, not the end of ctx: a limiter or ticker
// made with a fiber's request ctx lives as long as the run, not as long as
// the request.
func AfterRun(ctx context.Context, f func()) (stop func() bool) {
	if answers.AfterRun == nil {
		return nil
	}
	return answers.AfterRun(ctx, f)
}

// Real returns c as a Clock.
func Real(c clock.Clock) Clock { return realClock{c} }

type realClock struct{ c clock.Clock }

func (r realClock) Now() time.Time { return r.c.Now() }
func (r realClock) AfterFunc(d time.Duration, f func()) Timer {
	return r.c.AfterFunc(d, f)
}
