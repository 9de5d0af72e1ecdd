package sched

import (
	"context"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/sluice-go/sluice/vclock"
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

// ClockOf returns ctx's clock: its loop's clock when ctx belongs to a loop,
// else fallback (real time when fallback is nil).
func ClockOf(ctx context.Context, fallback clock.Clock) Clock {
	if l := nearestLoop(ctx); l != nil {
		return l.clock
	}
	if fallback == nil {
		fallback = clock.New()
	}
	return realClock{fallback}
}

type virtualClock struct{ c *vclock.Clock }

func (v virtualClock) Now() time.Time { return v.c.Now() }
func (v virtualClock) AfterFunc(d time.Duration, f func()) Timer {
	return v.c.AfterFunc(d, f)
}

type realClock struct{ c clock.Clock }

func (r realClock) Now() time.Time { return r.c.Now() }
func (r realClock) AfterFunc(d time.Duration, f func()) Timer {
	return r.c.AfterFunc(d, f)
}
