package sched

import (
	"time"

	"github.com/sluice-go/sluice/internal/loopctx"
	"github.com/sluice-go/sluice/vclock"
)

// virtualClock is a run's virtual clock as the loop and the blocking
// packages use it (loopctx.Clock).
type virtualClock struct{ c *vclock.Clock }

func (v virtualClock) Now() time.Time { return v.c.Now() }
func (v virtualClock) AfterFunc(d time.Duration, f func()) loopctx.Timer {
	return v.c.AfterFunc(d, f)
}
