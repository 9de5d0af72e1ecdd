package sched

import (
	"context"

	"github.com/sluice-go/sluice/internal/loopctx"
)

// The blocking packages (ratelimiter, ticker, the queue's Sources) ask what
// they need of a context's loop through internal/loopctx, which these
// functions answer: machinery the packages share, kept out of sched's API.
func init() {
	loopctx.Install(loopctx.Answers{Clock: loopClock, AfterRun: afterRun})
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
