// Package ticker is a drift-free ticker on a sched loop's clock (virtual or
// real) or on a real clock, usable from fibers and plain goroutines alike.
//
// Boundaries are absolute: start + k·period for k = 1, 2, …, where start is
// when the ticker was made (or last Reset). However late a caller comes back,
// the next boundary is still on that grid, so a loop that works between
// ticks never drifts. A caller that comes back after several boundaries have
// passed gets the newest one at once, and the older ones are counted as
// skipped (see Stats).
//
// A ticker is lazy: it arms a timer only while someone waits in Next, so a
// ticker nobody waits on costs nothing, holds no goroutine and keeps no
// sched.Run open.
package ticker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/sluice-go/sluice/internal/waitq"
	"github.com/sluice-go/sluice/sched"
)

// ErrStopped is returned by Next once the ticker is stopped, by Stop or by
// the end of the context given to New, including to every Next that was
// waiting at that moment.
var ErrStopped = errors.New("ticker: stopped")

// A Ticker delivers the boundaries start + k·period, each to at most one
// caller of Next, in FIFO order of the callers.
//
// A Ticker is safe for use by many goroutines and fibers at once. The zero
// value is not usable: call New.
type Ticker struct {
	clock     sched.Clock
	stopWatch func() bool // unregisters the stop on New's ctx

	mu       sync.Mutex // guards the fields below
	period   time.Duration
	start    time.Time                    // boundary k is start + k·period
	last     int64                        // boundaries 1..last are consumed or skipped
	consumed uint64                       // boundaries delivered by Next, since New
	skipped  uint64                       // boundaries passed over, since New (up to last)
	before   uint64                       // boundaries that passed before the last Reset
	queue    waitq.Queue[waiter, *waiter] // FIFO of parked callers
	stopped  bool
	timer    sched.Timer
	armed    bool
	timerAt  time.Time
}

// Stats counts the boundaries of a ticker since New:
// Fired == Skipped + Consumed + Pending always holds.
type Stats struct {
	Fired    uint64 // boundaries that have passed
	Skipped  uint64 // passed boundaries that no Next will ever return (a newer one passed first)
	Consumed uint64 // boundaries returned by Next
	Pending  uint64 // 0 or 1: the newest passed boundary, which the next Next returns at once
}

type waiter struct {
	waitq.Links[waiter] // in the queue; guarded by the owner's mu
	w                   sched.Waiter
	t                   *Ticker
	at                  time.Time // the boundary delivered
	err                 error     // set by Stop before Wake
}

var waiterPool = sync.Pool{New: func() any {
	wt := &waiter{}
	wt.w.Reason = "ticker.Next"
	wt.w.OnCancel = wt.cancel
	return wt
}}

// An Option configures New.
type Option func(*config)

type config struct {
	clock clock.Clock
	err   error
}

// WithClock sets the time source used outside any loop (the default is real
// time; a *clock.Mock lets tests move time with mock.Add). Inside a sched.Run
// loop the loop's clock is used instead.
func WithClock(c clock.Clock) Option {
	return func(cfg *config) {
		if c == nil {
			cfg.err = errors.New("ticker: WithClock(nil)")
		}
		cfg.clock = c
	}
}

// New returns a ticker whose boundaries are Now + k·period on ctx's clock
// (the loop's clock inside a sched.Run loop, else WithClock's or real time).
// When ctx ends the ticker stops, as by Stop. A period that is not positive
// is an error that names it.
func New(ctx context.Context, period time.Duration, opts ...Option) (*Ticker, error) {
	if period <= 0 {
		return nil, fmt.Errorf("ticker: period %v: must be positive", period)
	}
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.err != nil {
		return nil, cfg.err
	}
	t := &Ticker{clock: sched.ClockOf(ctx, cfg.clock), period: period}
	t.start = t.clock.Now()
	stop := func() { t.stop(false) }
	if a, ok := ctx.(interface{ AfterFunc(func()) func() bool }); ok {
		// A loop's context: the stop runs on the goroutine that ends it,
		// before Run returns; a run's root ends with the run even when its
		// Done is nil.
		t.stopWatch = a.AfterFunc(stop)
	} else if ctx.Done() != nil {
		t.stopWatch = context.AfterFunc(ctx, stop)
	}
	return t, nil
}

// passed returns how many boundaries have passed by now. t.mu is held.
func (t *Ticker) passed(now time.Time) int64 {
	if !now.After(t.start) {
		return 0
	}
	return int64(now.Sub(t.start) / t.period)
}

// Next waits for the next boundary not yet returned and returns it. If
// boundaries have passed since the last one returned, it returns the newest
// at once (the older ones count as skipped); otherwise it parks the caller
// (a fiber inside a loop, else the goroutine) until the next boundary. With
// several callers waiting, each boundary goes to one of them, in the order
// they called.
//
// It returns ctx.Err() if ctx ends first (consuming nothing), and
// ErrStopped once the ticker is stopped.
func (t *Ticker) Next(ctx context.Context) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	t.mu.Lock()
	if at, ok, err := t.tryLocked(); ok || err != nil {
		t.mu.Unlock()
		return at, err
	}
	t.mu.Unlock()

	wt := waiterPool.Get().(*waiter)
	wt.t, wt.err = t, nil
	wt.w.Prepare(ctx)
	t.mu.Lock()
	if at, ok, err := t.tryLocked(); ok || err != nil {
		t.mu.Unlock()
		wt.t = nil
		waiterPool.Put(wt)
		return at, err
	}
	t.queue.Push(wt)
	t.arm(t.clock.Now())
	t.mu.Unlock()

	err := t.wait(ctx, wt)
	at := wt.at
	if err == nil {
		err = wt.err
	}
	if err != nil {
		at = time.Time{}
	}
	wt.t, wt.err, wt.at = nil, nil, time.Time{}
	waiterPool.Put(wt)
	return at, err
}

// wait parks on wt. When a run loop stops the parked fiber instead of
// resuming it (sched.Run ending while the fiber still waits), Wait unwinds
// without OnCancel; the waiter must still leave the queue, or a later
// boundary would go to a fiber that no longer exists.
func (t *Ticker) wait(ctx context.Context, wt *waiter) error {
	returned := false
	defer func() {
		if !returned {
			wt.cancel() // a no-op when it is no longer queued
		}
	}()
	err := wt.w.Wait(ctx)
	returned = true
	return err
}

// tryLocked delivers a passed boundary if nobody waits. t.mu is held.
func (t *Ticker) tryLocked() (time.Time, bool, error) {
	if t.stopped {
		return time.Time{}, false, ErrStopped
	}
	if t.queue.Front() != nil {
		return time.Time{}, false, nil
	}
	if k := t.passed(t.clock.Now()); k > t.last {
		return t.take(k), true, nil
	}
	return time.Time{}, false, nil
}

// take consumes boundary k, the newest passed, skipping those before it.
// t.mu is held.
func (t *Ticker) take(k int64) time.Time {
	t.skipped += uint64(k - t.last - 1)
	t.consumed++
	t.last = k
	return t.start.Add(time.Duration(k) * t.period)
}

// serve hands passed boundaries to the waiters, FIFO, one each. t.mu is
// held.
func (t *Ticker) serve(now time.Time) {
	k := t.passed(now)
	for wt := t.queue.Front(); wt != nil && k > t.last; wt = t.queue.Front() {
		t.queue.Remove(wt)
		at := t.start.Add(time.Duration(k) * t.period)
		if wt.at = at; wt.w.Wake() {
			t.take(k)
		}
		// else: cancelled first; the boundary stays for the next waiter.
	}
}

// arm keeps the timer armed for the next boundary while anyone waits, and
// disarms it otherwise. t.mu is held.
func (t *Ticker) arm(now time.Time) {
	if t.stopped || t.queue.Front() == nil {
		if t.armed {
			t.timer.Stop()
			t.armed = false
		}
		return
	}
	at := t.start.Add(time.Duration(t.last+1) * t.period)
	if t.armed && t.timerAt.Equal(at) {
		return
	}
	d := max(at.Sub(now), 1)
	if t.timer == nil {
		t.timer = t.clock.AfterFunc(d, t.onTimer)
	} else {
		t.timer.Reset(d) // an earlier firing on its way is harmless: serve reads the clock
	}
	t.armed, t.timerAt = true, at
}

func (t *Ticker) onTimer() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.armed = false
	if t.stopped {
		return
	}
	now := t.clock.Now()
	t.serve(now)
	t.arm(now)
}

// cancel is every waiter's OnCancel: it takes the waiter out of the queue
// before the cancelled Next returns.
func (wt *waiter) cancel() {
	t := wt.t
	t.mu.Lock()
	defer t.mu.Unlock()
	if wt.Queued() {
		t.queue.Remove(wt)
		if !t.stopped {
			now := t.clock.Now()
			t.serve(now) // a boundary it was about to get goes to the next
			t.arm(now)
		}
	}
}

// Stop stops the ticker: every waiting Next returns ErrStopped, later calls
// return ErrStopped at once, and no timer stays armed. It reports true the
// first time only.
func (t *Ticker) Stop() bool { return t.stop(true) }

func (t *Ticker) stop(unwatch bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return false
	}
	t.stopped = true
	if unwatch && t.stopWatch != nil {
		t.stopWatch()
	}
	if t.armed {
		t.timer.Stop()
		t.armed = false
	}
	for wt := t.queue.Front(); wt != nil; wt = t.queue.Front() {
		t.queue.Remove(wt)
		wt.err = ErrStopped
		wt.w.Wake()
	}
	return true
}

// Reset restarts the grid at Now with a new period: the next boundary is
// Now + period. Boundaries that had passed and were not yet returned count
// as skipped. Waiting callers keep waiting, for the new grid. Reset of a
// stopped ticker changes the period only. It panics if period is not
// positive, as time.Ticker.Reset does.
func (t *Ticker) Reset(period time.Duration) {
	if period <= 0 {
		panic(fmt.Sprintf("ticker: Reset with non-positive period %v", period))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.clock.Now()
	k := t.passed(now)
	t.skipped += uint64(k - t.last)
	t.before += uint64(k)
	t.start, t.period, t.last = now, period, 0
	t.arm(now)
}

// Stats returns the ticker's counts now.
func (t *Ticker) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	var k int64
	if !t.stopped {
		k = t.passed(t.clock.Now())
	} else {
		k = t.last
	}
	s := Stats{Fired: t.before + uint64(k), Skipped: t.skipped, Consumed: t.consumed}
	if k > t.last {
		s.Pending = 1
		s.Skipped += uint64(k - t.last - 1)
	}
	return s
}

// Period returns the current period.
func (t *Ticker) Period() time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.period
}

// Waiters returns the number of callers waiting in Next.
func (t *Ticker) Waiters() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.queue.Len()
}
