// Package alarm is the parking core's lazy refill timer: one callback on a
// loopctx.Clock, armed only while someone waits.
package alarm

import (
	"time"

	"github.com/sluice-go/sluice/internal/loopctx"
)

// An Alarm is a queue.Queue's lazy refill timer: one callback on a
// loopctx.Clock, armed for an absolute instant only while its owner needs
// it, and re-armed in place (one timer for the owner's whole life, created
// on first need). The queue arms it, while a head waits, for the instant
// its Source says the head's units are due (a ticker's next boundary, the
// instant a limiter's head has its tokens), and clears it when nobody waits.
//
// An Alarm is not safe for concurrent use: its owner calls Set and Clear
// under its own lock (the queue's). The callback runs
// on the clock's timer goroutine (the loop's goroutine under a virtual
// clock), without that lock; a callback of an earlier arming may arrive late,
// so it must work out from the clock what is due.
type Alarm struct {
	clock loopctx.Clock
	f     func()
	timer loopctx.Timer // created on first Set
	armed bool          // timer is armed for at
	at    time.Time
}

// New returns an unarmed alarm that calls f on clock.
func New(clock loopctx.Clock, f func()) *Alarm { return &Alarm{clock: clock, f: f} }

// Set arms the alarm for at (at least 1 ns after now), unless it is armed
// for at already and at is still ahead.
func (a *Alarm) Set(now, at time.Time) {
	if a.armed && a.at.Equal(at) && at.After(now) {
		return
	}
	d := max(at.Sub(now), 1)
	if a.timer == nil {
		a.timer = a.clock.AfterFunc(d, a.f)
	} else {
		a.timer.Reset(d)
	}
	a.armed, a.at = true, at
}

// Clear disarms the alarm.
func (a *Alarm) Clear() {
	if a.armed {
		a.timer.Stop()
		a.armed = false
	}
}
