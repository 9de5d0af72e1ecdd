// Package loopctx is what this module's blocking packages (ratelimiter,
// ticker, the queue's Sources, httplimittest) ask of a caller's context
// about the sched.Run loop it may belong to: its clock, whether it belongs
// to a loop at all, and the end of that loop's run. The answers are sched's,
// filled in by sched's init: a program without sched has no loops, and then
// every context belongs to none. Internal, so that this machinery is not
// part of sched's API and can change with it.
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
