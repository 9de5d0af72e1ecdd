// Package vclock is a virtual clock with a timer queue. Time moves only when
// told to, by hand (Advance, AdvanceTo) or by a run loop (package sched) that
// jumps to the next deadline when every fiber is parked.
//
//	c := vclock.New(vclock.Epoch())
//	c.AfterFunc(time.Second, func() { fmt.Println(c.Now().Sub(vclock.Epoch())) })
//	c.Advance(time.Hour) // prints 1s at once: the callback sees its own deadline
//
// Timers fire in (deadline, creation order), or in a caller-chosen order
// among equal deadlines (SetTieBreaker). Each callback runs with the
// clock reading exactly its own deadline, and never under the clock's lock,
// so a callback may read the clock, stop timers or add new ones. Nothing in
// this package sleeps in real time.
package vclock

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Epoch returns the start of a clock created with a zero time:
// 2000-01-01T00:00:00Z. A function, not a variable: no package can move
// the instant every other clock in the program starts from.
func Epoch() time.Time { return time.Date(2000, time.January, 1, 0, 0, 0, 0, time.UTC) }

// A Clock is a virtual clock. It is safe for concurrent use; its zero value
// is not usable, call New.
type Clock struct {
	base time.Time // the start; readings are base plus an offset

	mu     sync.Mutex
	now    time.Duration // offset of the current time from base
	seq    uint64        // creation order of timers, the tie-breaker for equal deadlines
	ties   func() uint64 // if set, draws the order of equal deadlines (SetTieBreaker)
	timers timerQueue    // entries, earliest (deadline, seq) first
	live   int           // armed timers; the rest of the entries are stale
	ended  func()        // runs when firing drops to zero (vwake.Watch); nil: nothing

	// Fires in flight: timers taken off the queue whose callback or Wake
	// has not returned. Raised under mu as the timer is taken, dropped
	// without it; read without it by a run loop (vwake.Watch).
	firing atomic.Int32
}

// New returns a clock reading start. A zero start means Epoch.
func New(start time.Time) *Clock {
	if start.IsZero() {
		start = Epoch()
	}
	return &Clock{base: start}
}

// offset converts t to an offset from c.base (saturating far in the future).
func (c *Clock) offset(t time.Time) time.Duration { return t.Sub(c.base) }

// Now returns the clock's current time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.base.Add(c.now)
}

// Since returns the time elapsed since t on this clock.
func (c *Clock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// Until returns the duration until t on this clock.
func (c *Clock) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }

// AfterFunc arms a timer that calls f once the clock reaches Now()+d. A d of
// zero or less fires at the current instant, on the next Advance or AdvanceTo
// (including Advance(0)). f runs on the goroutine that advances the clock,
// without the clock's lock held. It panics if f is nil.
func (c *Clock) AfterFunc(d time.Duration, f func()) *Timer {
	if f == nil {
		panic("vclock: AfterFunc with nil func")
	}
	t := &Timer{c: c, f: f}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.arm(t, d)
	return t
}

// arm schedules t at now+d (never before now). c.mu is held.
func (c *Clock) arm(t *Timer, d time.Duration) {
	if d < 0 {
		d = 0
	}
	t.when = c.now + d
	if t.when < c.now { // overflow: beyond any reachable time
		t.when = 1<<63 - 1
	}
	c.seq++
	t.seq, t.armed = c.seq, true
	if c.ties != nil {
		// The drawn value orders equal deadlines, in the high half of the
		// sequence number; the count in the low half keeps each arming of
		// a timer distinct from its stale entries (see entry.live) and
		// breaks ties between equal draws in creation order. Packed, so
		// that queue entries stay 24 bytes.
		t.seq = c.ties()<<32 | c.seq&(1<<32-1)
	}
	c.live++
	c.timers.push(entry{when: t.when, seq: t.seq, t: t})
}

// disarm marks t stopped, leaving its entry stale. c.mu is held.
func (c *Clock) disarm(t *Timer) {
	t.armed = false
	c.live--
	if stale := c.timers.len() - c.live; stale > 64 && stale > c.live {
		// Sweep, so that many stopped timers (cancelled timeouts) cannot
		// grow the queue without bound.
		c.timers.filter(entry.live)
	}
}

// top returns the earliest live entry, dropping stale ones. c.mu is held.
func (c *Clock) top() (entry, bool) {
	for {
		e, ok := c.timers.top()
		// With no stale entry the top is live without a look at its
		// Timer, which is likely out of cache.
		if !ok || c.timers.len() == c.live || e.live() {
			return e, ok
		}
		c.timers.pop()
	}
}

// SetTieBreaker changes the order of timers armed from now on that share a
// deadline: they fire in the order of the low 32 bits of the values next
// returns for them (creation order among equal values) instead of creation
// order. A nil next restores creation order. Schedule exploration
// (sched.WithSeed) passes a seeded generator here. next runs under the
// clock's lock: it must not use the clock.
func (c *Clock) SetTieBreaker(next func() uint64) {
	c.mu.Lock()
	c.ties = next
	c.mu.Unlock()
}

// Advance moves the clock forward by d, firing every timer whose deadline is
// reached, one at a time in (deadline, creation order), with the clock set to
// each timer's deadline while its callback runs. Timers that callbacks add
// within the window fire too. It panics if d is negative: time never goes
// backwards.
func (c *Clock) Advance(d time.Duration) {
	if d < 0 {
		panic(fmt.Sprintf("vclock: Advance by negative duration %v", d))
	}
	c.mu.Lock()
	target := c.now + d
	if target < c.now { // overflow: saturate, as arm does a deadline
		target = 1<<63 - 1
	}
	c.mu.Unlock()
	c.advanceTo(target)
}

// AdvanceTo moves the clock forward to t as Advance does. A t at or before
// Now fires only the timers already due and leaves the time unchanged: time
// never goes backwards.
func (c *Clock) AdvanceTo(t time.Time) { c.advanceTo(c.offset(t)) }

// FireNext fires the single earliest timer if its deadline is at or before
// limit, moving the clock to that deadline first. It reports whether a timer
// fired. Run loops use it to interleave timers with the fibers they wake.
func (c *Clock) FireNext(limit time.Time) bool { return c.fireNext(c.offset(limit)) }

func (c *Clock) fireNext(limit time.Duration) bool {
	c.mu.Lock()
	e, ok := c.top()
	if !ok || e.when > limit {
		c.mu.Unlock()
		return false
	}
	c.timers.pop()
	t := e.t
	t.armed = false
	c.live--
	if e.when > c.now { // e.when is t.when: no look at t for it
		c.now = e.when
	}
	f, w := t.f, t.w
	// Why count fires in flight: from here until its wake is delivered
	// the timer is on no queue, and a run loop idle meanwhile, on another
	// goroutine, would see nothing left that can wake its fibers. Raised
	// under mu, so a look at the queue that finds the timer gone sees the
	// count raised too.
	c.firing.Add(1)
	ended := c.ended
	c.mu.Unlock()
	defer c.fireEnded(ended) // deferred: a callback's panic must not leave the count raised
	if w != nil {
		w.Wake()
	} else {
		f()
	}
	return true
}

// fireEnded drops the count of fires in flight, after the fire's wake, and
// tells the watcher the fire was taken with when the count reaches zero.
func (c *Clock) fireEnded(ended func()) {
	if c.firing.Add(-1) == 0 && ended != nil {
		ended()
	}
}

func (c *Clock) advanceTo(target time.Duration) {
	for c.fireNext(target) {
	}
	c.mu.Lock()
	if target > c.now {
		c.now = target
	}
	c.mu.Unlock()
}

// Next returns the earliest pending deadline, and false when no timer is armed.
func (c *Clock) Next() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.top()
	if !ok {
		return time.Time{}, false
	}
	return c.base.Add(e.when), true
}

// Pending returns the number of armed timers.
func (c *Clock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.live
}

// String reports the clock's time, for logs and test failures.
func (c *Clock) String() string { return "vclock " + c.Now().Format(time.RFC3339Nano) }
