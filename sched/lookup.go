package sched

import (
	"context"

	"github.com/sluice-go/sluice/internal/loopctx"
)

// The blocking packages (ratelimiter, ticker, the parking core under them
// and semaphore) ask what they need of a context's loop through
// internal/loopctx, which these functions answer: machinery the packages
// share, kept out of sched's API.
func init() {
	loopctx.Install(loopctx.Answers{Clock: loopClock, AfterRun: afterRun, NewWaiter: newHookWaiter})
}

// A hookWaiter is a waiter as loopctx.Waiter: Prepare takes what a
// DeadlockError shows of the wait.
type hookWaiter struct{ waiter }

func (h *hookWaiter) Prepare(ctx context.Context, reason string, n int64) {
	h.Reason, h.N = reason, n
	h.waiter.Prepare(ctx)
}

// newHookWaiter returns a waiter for loopctx.NewWaiter.
func newHookWaiter(onCancel func()) loopctx.Waiter {
	h := &hookWaiter{}
	h.OnCancel = onCancel
	return h
}

// loopClock returns the clock of ctx's loop, found through any wrapper; nil
// when ctx belongs to no loop.
func loopClock(ctx context.Context) loopctx.Clock {
	if l := nearestLoop(ctx); l != nil {
		return l.clock
	}
	return nil
}

// afterRun registers f on the end of the run ctx belongs to (see
// loopctx.AfterRun); nil when ctx belongs to no loop.
func afterRun(ctx context.Context, f func()) (stop func() bool) {
	l := nearestLoop(ctx)
	if l == nil {
		return nil
	}
	return l.afterRun.AfterFunc(f)
}
