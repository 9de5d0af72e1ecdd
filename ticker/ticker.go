// Package ticker is a drift-free ticker on a sched loop's clock (virtual or
// real) or on a real clock, usable from fibers and plain goroutines alike.
//
//	t, err := ticker.New(ctx, time.Minute)
//	if err != nil { ... }
//	defer t.Stop()
//	for {
//		at, err := t.Next(ctx) // on the grid start + k·minute, however long the work took
//		if err != nil {
//			return err
//		}
//		flush(at)
//	}
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
//
// Next blocks until the next boundary: inside a sched.Run loop it parks the
// calling fiber and the boundaries are on the loop's clock (virtual or
// real); outside any loop it blocks the goroutine on real time, on the clock
// given with WithClock (a *clock.Mock for tests that move time by hand), or,
// inside a testing/synctest bubble, on the bubble's fake time. A ctx that is
// done before Next returns wins: Next returns ctx.Err() and the boundary
// goes to the next caller.
//
// A Ticker parks its callers on the same FIFO core as semaphore.Semaphore
// and ratelimiter.Limiter, whose units here are the boundaries its clock
// produces.
package ticker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/sluice-go/sluice/internal/loopctx"
	"github.com/sluice-go/sluice/internal/queue"
)

// ErrStopped is returned by Next once the ticker is stopped, by Stop or by
// the end of the run it was made in, including to every Next that was
// waiting at that moment.
var ErrStopped = errors.New("ticker: stopped")

// A Ticker delivers the boundaries start + k·period, each to at most one
// caller of Next, in FIFO order of the callers.
//
// Its one unit is the newest passed boundary not yet returned, produced
// from the clock by its grid; the parking, hand-off and hand-back are the
// core it shares with semaphore and ratelimiter.
//
// A Ticker is safe for use by many goroutines and fibers at once. The zero
// value is not usable: call New.
type Ticker struct {
	q         *queue.Queue
	g         grid
	stopWatch func() bool // unregisters the stop at the end of the run
}

// grid is the Ticker's Source: it says what a unit is (the newest passed
// boundary) and when the next comes. Its state is guarded by the queue's
// lock.
type grid struct {
	clock    loopctx.Clock
	period   time.Duration
	origin   time.Time // New's Now: a granted boundary is carried as its offset from origin
	start    time.Time // boundary k is start + k·period
	last     int64     // the newest boundary produced; the queue holds it while unreturned
	consumed uint64    // boundaries delivered by Next, since New
	skipped  uint64    // boundaries passed over, since New
	before   uint64    // boundaries that passed before the last Reset
}

// Stats counts the boundaries of a ticker since New:
// Fired == Skipped + Consumed + Pending always holds.
type Stats struct {
	Fired    uint64 // boundaries that have passed
	Skipped  uint64 // passed boundaries that no Next will ever return (a newer one passed first)
	Consumed uint64 // boundaries returned by Next
	Pending  uint64 // 0 or 1: the newest passed boundary, which the next Next returns at once
}

// An Option configures New.
type Option func(*config)

type config struct {
	clock clock.Clock
	err   error
}

// WithClock sets the time source used outside any loop (the default is real
// time, which is also a testing/synctest bubble's fake time; a *clock.Mock
// lets tests move time with mock.Add). Inside a sched.Run loop the loop's
// clock is used instead.
func WithClock(c clock.Clock) Option {
	return func(cfg *config) {
		if c == nil {
			cfg.err = errors.New("ticker: WithClock(nil)")
		}
		cfg.clock = c
	}
}

// New returns a ticker whose boundaries are Now + k·period on ctx's clock
// (the loop's clock when ctx belongs to a sched.Run loop, through any
// wrapper, else WithClock's or real time). ctx chooses the time domain only:
// a ticker made in a loop stops when that run ends; outside any loop only
// Stop stops it. A period that is not positive is an error that names it.
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
	t := &Ticker{}
	t.g.clock = loopctx.ClockOf(ctx, cfg.clock)
	t.g.period, t.g.start = period, t.g.clock.Now()
	t.g.origin = t.g.start
	t.q = queue.New(queue.Config{Reason: "ticker.Next", Source: &t.g, Clock: t.g.clock})
	t.stopWatch = loopctx.AfterRun(ctx, func() { t.q.Close(ErrStopped) })
	return t, nil
}

// passed returns how many boundaries have passed by now.
func (g *grid) passed(now time.Time) int64 {
	if !now.After(g.start) {
		return 0
	}
	return int64(now.Sub(g.start) / g.period)
}

func (g *grid) boundary(k int64) time.Time {
	d := time.Duration(k) * g.period
	if k > 1 && d/time.Duration(k) != g.period {
		// k·period wrapped (a period of decades, k past 2^63 ns): step a
		// period from the boundary before, which time.Time holds.
		return g.boundary(k - 1).Add(g.period)
	}
	return g.start.Add(d)
}

func (g *grid) Now() time.Time { return g.clock.Now() }

// Fill makes the newest passed boundary the queue's unit; an older one it
// replaces, unreturned, is skipped.
func (g *grid) Fill(now time.Time, avail, _ int64, _ bool) int64 {
	k := g.passed(now)
	if k <= g.last {
		return avail
	}
	g.skipped += uint64(k - g.last - 1 + avail)
	g.last = k
	return 1
}

// Due is the next boundary. (The queue is not told to fail early: a Next
// with a deadline before it waits until that deadline, as a select on a
// time.Ticker and a timer would, since a Reset may bring the boundary
// closer meanwhile.)
func (g *grid) Due(time.Time, int64, int64) (time.Time, bool) { return g.boundary(g.last + 1), true }

// Take delivers boundary last; the mark is its offset from origin, which a
// later Reset does not change.
func (g *grid) Take(int64) int64 {
	g.consumed++
	return int64(g.boundary(g.last).Sub(g.origin))
}

// Return takes back a boundary: it is the unit again if no newer one has
// passed (nor a Reset), else it is skipped.
func (g *grid) Return(_, _ time.Time, avail, _, mark int64) int64 {
	g.consumed--
	if g.last > 0 && mark == int64(g.boundary(g.last).Sub(g.origin)) {
		return avail + 1
	}
	g.skipped++
	return avail
}

// Next waits for the next boundary not yet returned and returns it. If
// boundaries have passed since the last one returned, it returns the newest
// at once (the older ones count as skipped); otherwise it parks the caller
// (a fiber inside a loop, else the goroutine) until the next boundary. With
// several callers waiting, each boundary goes to one of them, in the order
// they called.
//
// It returns ctx.Err() if ctx is done before Next returns (consuming
// nothing: the boundary goes to the next caller; a deadline ends the wait
// at its exact instant), and ErrStopped once the ticker is stopped.
func (t *Ticker) Next(ctx context.Context) (time.Time, error) {
	mark, err := t.q.Acquire(ctx, 1)
	if err != nil {
		return time.Time{}, err
	}
	return t.g.origin.Add(time.Duration(mark)), nil
}

// Stop stops the ticker: every waiting Next returns ErrStopped, later calls
// return ErrStopped at once, and no timer stays armed. It reports true the
// first time only.
func (t *Ticker) Stop() bool {
	if t.stopWatch != nil {
		t.stopWatch()
	}
	return t.q.Close(ErrStopped)
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
	t.q.Do(func(s *queue.State) {
		if s.Closed {
			t.g.period = period
			return
		}
		t.g.skipped += uint64(s.Avail)
		t.g.before += uint64(t.g.last)
		t.g.start, t.g.period, t.g.last = s.Now, period, 0
		s.Avail = 0
	})
}

// Stats returns the ticker's counts now.
func (t *Ticker) Stats() Stats {
	var st Stats
	t.q.Do(func(s *queue.State) {
		g := &t.g
		st = Stats{Fired: g.before + uint64(g.last), Skipped: g.skipped, Consumed: g.consumed, Pending: uint64(s.Avail)}
	})
	return st
}

// Period returns the current period.
func (t *Ticker) Period() time.Duration {
	var p time.Duration
	t.q.Do(func(*queue.State) { p = t.g.period })
	return p
}

// Waiters returns the number of callers waiting in Next.
func (t *Ticker) Waiters() int { return t.q.Waiters() }
