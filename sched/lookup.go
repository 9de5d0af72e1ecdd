package sched

import "context"

// InLoop reports whether ctx belongs to a run loop: whether it is a context
// of a fiber, or derived from one through any wrapper (context.WithValue,
// WithCancel, WithTimeout, …). Waits that take such a ctx park the fiber and
// use the loop's clock. It is the one place other packages ask.
func InLoop(ctx context.Context) bool { return nearestLoop(ctx) != nil }

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
	l := nearestLoop(ctx)
	if l == nil {
		return nil
	}
	return l.afterRun.AfterFunc(f)
}
