package sched

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/sluice-go/sluice/internal/loopctx"
	"github.com/sluice-go/sluice/internal/vwake"
	"github.com/sluice-go/sluice/vclock"
)

// Now returns the current time of ctx's clock: the loop's clock inside a
// loop, real time outside one.
func Now(ctx context.Context) time.Time {
	if l := nearestLoop(ctx); l != nil {
		return l.clock.Now()
	}
	return time.Now()
}

// Yield lets every other runnable fiber run once before the calling fiber
// goes on (under WithSeed it is a scheduling point where the next fiber is
// drawn from the seed, the caller included). Outside a loop it is
// runtime.Gosched.
func Yield(ctx context.Context) {
	l := nearestLoop(ctx)
	if l == nil {
		runtime.Gosched()
		return
	}
	f := l.current
	if f == nil {
		panic("sched: Yield with a loop's context outside the loop's fibers")
	}
	l.drain() // fibers woken earlier run first: FIFO
	l.runq.push(f)
	l.park(f, nil)
}

// A sleeper is the waiter of Sleep, with its timer kept for the next Sleep,
// so a Sleep allocates nothing in the steady state. Each fiber keeps the one
// its first Sleep made (Fiber.sleep), on its loop's clock. Why not a
// sync.Pool: a fiber that wakes then finds its own sleeper, not the last one
// another fiber returned, which with 100k fibers asleep is out of cache. Why
// not a field of Fiber by value: every fiber would carry it, sleeping or
// not, and fibers that never sleep run measurably slower for the larger
// fiber.
//
// Under a virtual clock the timer is vt, in the sleeper itself, and its fire
// calls w.Wake directly (vwake.Bind): a wake touches one object next to the
// heap entry, not a timer, a callback and a waiter apart, each a cache miss
// with 100k fibers asleep. Under real time it is timer, calling wake.
type sleeper struct {
	w     waiter
	vt    vclock.Timer  // virtual clock: bound to w, armed by Reset
	timer loopctx.Timer // real time: on the loop's clock, calls wake
	wake  func()
}

// Sleep pauses the caller for d on ctx's clock and returns nil, or returns
// ctx.Err() as soon as ctx ends. Inside a loop it parks the fiber (under a
// virtual clock it wakes at exactly Now()+d); outside a loop it blocks the
// goroutine on real time. Sleep(ctx, 0) yields. A negative d is an error.
func Sleep(ctx context.Context, d time.Duration) error {
	// Why the rare paths are functions of their own: a fiber asleep comes
	// back through Sleep's frame on a stack gone cold, one cache miss per
	// line of frames; with the goroutine path (a timer, a select, a defer)
	// and the first Sleep's setup inline, Sleep's frame took 216 bytes.
	if d < 0 {
		return negativeSleep(d)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	l := nearestLoop(ctx)
	if l == nil {
		return sleepOutside(ctx, d)
	}
	if d == 0 {
		Yield(ctx)
		return nil
	}
	f := l.running.Load()
	if f == nil {
		panic("sched: a loop's context used to wait outside the loop's fibers")
	}
	s := f.sleep
	if s == nil {
		s = newSleeper(l, f)
	}
	s.w.Prepare(ctx)
	if l.virtual != nil {
		s.vt.Reset(d) // arms it as AfterFunc would: same order, same ties
	} else {
		s.armReal(l, d)
	}
	if c, ok := ctx.(*loopCtx); ok && c.neverDone {
		// Nothing can cancel this wait (Run stops the fiber instead), so
		// it parks without Wait's registration: fewer frames to come back
		// through on a stack that went cold while the fiber slept.
		l.park(f, &s.w)
		return nil
	}
	return s.wait(ctx, l, f)
}

func negativeSleep(d time.Duration) error {
	return fmt.Errorf("sched: Sleep with negative duration %v", d)
}

// sleepOutside is Sleep outside any loop: the goroutine blocks on real time.
func sleepOutside(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// newSleeper makes f's sleeper, at its first Sleep, on l's clock.
func newSleeper(l *loop, f *Fiber) *sleeper {
	s := &sleeper{}
	s.w.Reason = "sched.Sleep"
	if l.virtual != nil {
		vwake.Bind(&s.vt, l.virtual, &s.w)
	} else {
		s.wake = func() { s.w.Wake() }
	}
	f.sleep = s
	return s
}

// armReal arms s's real-time timer for d.
func (s *sleeper) armReal(l *loop, d time.Duration) {
	if s.timer != nil {
		s.timer.Reset(d)
		return
	}
	s.timer = l.clock.AfterFunc(d, s.wake)
}

// wait is Sleep's wait on a context that may end first.
func (s *sleeper) wait(ctx context.Context, l *loop, f *Fiber) error {
	err := s.w.Wait(ctx)
	if err != nil && !s.stop(l) {
		// The timer is firing on another goroutine and will call Wake on
		// this waiter: never reuse it.
		f.sleep = nil
	}
	return err
}

// stop disarms s's timer, reporting whether it was armed.
func (s *sleeper) stop(l *loop) bool {
	if l.virtual != nil {
		return s.vt.Stop()
	}
	return s.timer.Stop()
}

// Advance moves the virtual time of ctx's loop forward by d, step by step:
// it fires the next due timer, runs every fiber that timer woke until they
// all park, and repeats until d has passed; then the calling fiber resumes
// at exactly Now()+d. Other fibers' timers beyond that instant do not fire.
// It returns ErrNotInLoop outside a loop, ErrNotVirtual under real time, and
// an error for a negative d or when another fiber is inside Advance.
func Advance(ctx context.Context, d time.Duration) error {
	l := nearestLoop(ctx)
	switch {
	case l == nil:
		return ErrNotInLoop
	case l.virtual == nil:
		return ErrNotVirtual
	case d < 0:
		return fmt.Errorf("sched: Advance by negative duration %v", d)
	case l.current == nil:
		panic("sched: Advance with a loop's context outside the loop's fibers")
	case l.advancer != nil:
		return fmt.Errorf("sched: Advance: fiber %d is already advancing the clock", l.advancer.id)
	}
	f := l.current
	l.advancer = f
	l.advanceTarget = l.clock.Now().Add(d)
	l.park(f, nil)
	return nil
}
