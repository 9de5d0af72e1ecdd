// Package alarm is the lazy timer of the queue's Sources: one callback on a
// loopctx.Clock, armed only while its owner needs it.
package alarm

import (
	"time"

	"github.com/sluice-go/sluice/internal/loopctx"
)

// An Alarm is the ticker's lazy timer: one callback on a loopctx.Clock, armed
// for an absolute instant only while its owner needs it, and re-armed in
// place (one timer for the owner's whole life, created on first need). A
// Ticker arms it for its next boundary while someone waits in Next; a
// ratelimiter.Limiter for the instant its head waiter's tokens are due.
//
// An Alarm is not safe for concurrent use: its owner calls Set and Clear
// under its own lock (a queue.Queue's, for a Source). The callback runs
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
