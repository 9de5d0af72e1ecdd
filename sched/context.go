package sched

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/internal/loopctx"
)

// ctxKey is the context key under which a loop's contexts find the nearest
// loop context (*loopCtx).
type ctxKey struct{}

// A loopCtx is a cancellable context bound to a loop: the root context of
// Run, a daemon's context, and the contexts of WithTimeout and WithDeadline.
//
// Why not context.WithCancel: its Err can only become Canceled, and a
// deadline on the loop's clock must read DeadlineExceeded in this context and
// in every context derived from it. Why not context.WithDeadline: it runs on
// real time. loopCtx implements AfterFunc, so the standard library registers
// contexts derived from it without a goroutine each, and propagates its
// exact error to them.
type loopCtx struct {
	parent   context.Context
	l        *loop
	deadline time.Time // zero when this context has none of its own
	done     chan struct{}
	// neverDone marks a root whose parent can never be cancelled: it ends
	// only when Run does, so waits on it register nothing (their fibers
	// are stopped, not cancelled, when Run ends). Its Done is not nil all
	// the same: the standard library registers the contexts derived from
	// it through AfterFunc, so that cancelling one of them reaches the
	// loop before that cancel returns (see AfterFunc's stop).
	neverDone bool

	errp atomic.Pointer[error] // set once, under mu; read without it

	mu         sync.Mutex
	cause      error
	funcs      afterFuncList // AfterFunc callbacks, run once on cancel, in registration order
	waiters    list[waiter]  // parked Waiters, cancelled on cancel
	timer      loopctx.Timer // the deadline timer, nil when none is armed
	stopParent func() bool   // unregisters from a loop context parent
	watching   *watch        // the watch on a standard parent
}

func newLoopCtx(parent context.Context, l *loop) *loopCtx {
	c := &loopCtx{parent: parent, l: l, done: make(chan struct{})}
	c.propagate()
	return c
}

// propagate arranges for c to be cancelled when its parent is.
func (c *loopCtx) propagate() {
	if c.parent.Done() == nil {
		return
	}
	if err := c.parent.Err(); err != nil {
		c.cancel(err, context.Cause(c.parent))
		return
	}
	if p := nearestLoopCtx(c.parent); p != nil {
		// A loop context, possibly under WithValue wrappers: register
		// directly, so the error propagates synchronously on the loop.
		c.stopParent = p.AfterFunc(func() { c.cancel(p.Err(), p.causeOrErr()) })
		return
	}
	// A standard parent: the loop settles it before every scheduling
	// decision (see loop.watch).
	parent := c.parent
	n := c.l.watch(parent, func() { c.cancel(parent.Err(), context.Cause(parent)) })
	c.mu.Lock()
	if c.Err() == nil {
		c.watching, n = n, nil
	}
	c.mu.Unlock()
	if n != nil { // the watch fired already, before c could keep it
		c.l.unwatch(n)
	}
}

// nearestLoopCtx returns ctx's nearest loop context when ctx is done exactly
// when that context is (ctx is the loop context itself or a value wrapper).
func nearestLoopCtx(ctx context.Context) *loopCtx {
	if c, ok := ctx.(*loopCtx); ok {
		return c
	}
	c, _ := ctx.Value(ctxKey{}).(*loopCtx)
	if c == nil || ctx.Done() != c.done {
		return nil
	}
	return c
}

func (c *loopCtx) Deadline() (time.Time, bool) {
	if !c.deadline.IsZero() {
		return c.deadline, true
	}
	return c.parent.Deadline()
}

func (c *loopCtx) Done() <-chan struct{} { return c.done }

func (c *loopCtx) Err() error {
	if p := c.errp.Load(); p != nil {
		return *p
	}
	return nil
}

func (c *loopCtx) causeOrErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cause != nil {
		return c.cause
	}
	return c.Err()
}

func (c *loopCtx) Value(key any) any {
	if key == (ctxKey{}) {
		return c
	}
	return c.parent.Value(key)
}

func (c *loopCtx) String() string { return "sched.loopContext" }

// AfterFunc arranges to call f once after c is cancelled, on the goroutine
// that cancels it (without c's lock held). It returns a function that
// unregisters f and reports whether it did so before f started. It is what
// context.AfterFunc and the standard derived contexts use.
//
// Callbacks run in registration order, so that the same program cancels
// the same children in the same order on every run.
func (c *loopCtx) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	if c.Err() != nil {
		c.mu.Unlock()
		f()
		return func() bool { return false }
	}
	a := &afterFunc{c: c, f: f}
	c.funcs.push(a)
	c.mu.Unlock()
	// A method value: its closure is how a standard child of c, which
	// keeps it, leads a wait back to a (see linkedAfterFunc).
	return a.stop
}

// An afterFunc is one AfterFunc registration on a loop context. When the
// standard library registers a child context through it (context.WithCancel
// and the like made directly from a loop context), the waits parked on that
// child are listed here: the child can end only by its own cancel or timer,
// which calls stop, or through c's cancel, which calls f; both run this
// package's code on the cancelling goroutine, which ends those waits then,
// with no scan and no goroutine in between.
type afterFunc struct {
	ln node // in c.funcs, guarded by c.mu; first, see list
	c  *loopCtx
	f  func()

	// Guarded by c.mu.
	listed  bool      // in c.funcs: neither run nor stopped
	watches watchList // waits on the standard child registered through a
}

// stop unregisters a, reporting whether it did so before f started. The
// standard child registered through a calls it once that child is done
// (its cancel function or its deadline ended it): the waits on the child
// end now, before cancel returns, and so do those on its standard
// descendants (settle).
func (a *afterFunc) stop() bool {
	c := a.c
	c.mu.Lock()
	if !a.listed {
		c.mu.Unlock()
		return false
	}
	c.funcs.remove(a)
	ws := a.watches.takeAll()
	c.mu.Unlock()
	fireAll(ws)
	c.l.settle()
	return true
}

// afterFuncList is a doubly linked list of registrations in registration
// order.
type afterFuncList struct{ list[afterFunc] }

func (q *afterFuncList) push(a *afterFunc) {
	q.pushBack(a)
	a.listed = true
}

func (q *afterFuncList) remove(a *afterFunc) {
	q.list.remove(a)
	a.listed = false
}

// addWaiter registers w to be cancelled with c. It reports false, registering
// nothing, when c is already done.
func (c *loopCtx) addWaiter(w *waiter) bool {
	if c.neverDone {
		return c.Err() == nil // nothing to register with: see neverDone
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.Err() != nil {
		return false
	}
	c.waiters.pushBack(w)
	w.ctx = c
	return true
}

// removeWaiter unregisters w if it is still registered.
func (c *loopCtx) removeWaiter(w *waiter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w.ctx == c {
		c.waiters.remove(w)
		w.ctx = nil
	}
}

// cancel ends c with err (and cause, defaulting to err) unless it has ended
// already. Callbacks and waiters run after the lock is released, so they may
// take other locks, read c, or cancel other contexts.
func (c *loopCtx) cancel(err, cause error) {
	if cause == nil {
		cause = err
	}
	c.mu.Lock()
	if c.Err() != nil {
		c.mu.Unlock()
		return
	}
	c.errp.Store(&err)
	c.cause = cause
	close(c.done)
	// Snapshot the waiters with the generation they waited in: a waiter
	// woken and reused meanwhile must not be cancelled in its new wait.
	var parked []waiterGen
	for w := c.waiters.takeAll(); w != nil; w = next(w) {
		parked = append(parked, waiterGen{w, w.gen()})
		w.ctx = nil
	}
	// Every registration is taken with the waits linked to it: a wait
	// that tries to link from now on finds c done and is settled instead.
	var funcs []*afterFunc
	for a := c.funcs.takeAll(); a != nil; {
		nx := next(a)
		unlink(a)
		a.listed = false
		funcs = append(funcs, a)
		a = nx
	}
	timer, stopParent, watching := c.timer, c.stopParent, c.watching
	c.timer, c.stopParent, c.watching = nil, nil, nil
	c.mu.Unlock()

	if timer != nil {
		timer.Stop()
	}
	if stopParent != nil {
		stopParent()
	}
	if watching != nil {
		c.l.unwatch(watching)
	}
	for _, p := range parked {
		p.w.cancelGen(p.gen)
	}
	// In registration order: the standard children cancel their own
	// children synchronously, in turn, and the waits on each child end
	// right after it.
	for _, a := range funcs {
		a.f()
		c.mu.Lock()
		ws := a.watches.takeAll()
		c.mu.Unlock()
		fireAll(ws)
	}
	// Waits on standard descendants further down end now too, not at the
	// next scheduling decision.
	c.l.settle()
}

// AfterFunc arranges to call f once after ctx is done, as context.AfterFunc
// does, and returns a stop function that unregisters f, reporting whether
// it did so before f started. context.AfterFunc always runs f on a goroutine
// of its own, so inside a loop its effects land whenever the Go scheduler
// runs that goroutine; AfterFunc runs f at a fixed point of the schedule
// instead, so that a chain of cancellations (f cancelling another context)
// replays identically. When ctx is a context of Run, of Daemon, of
// WithTimeout or WithDeadline (or a value wrapper of one), f runs on the
// goroutine that cancels it, before that cancel returns. When ctx is a
// standard context over a loop's context (context.WithCancel and the like),
// f runs on the loop's goroutine at the first scheduling decision after ctx
// is done, before any other fiber runs; or sooner, on the cancelling
// goroutine before cancel returns, when the cancellation reaches the loop
// through a context of this package (the cancel of such a context, or of a
// standard context made directly from one that can end).
// Outside any loop it is context.AfterFunc. f must not block.
func AfterFunc(ctx context.Context, f func()) (stop func() bool) {
	l := nearestLoop(ctx)
	if l == nil {
		return context.AfterFunc(ctx, f)
	}
	// Listed until f has returned or stop has prevented it: f may wake a
	// fiber, and a cancel on another goroutine runs it there, after ctx is
	// done; an idle loop waits for it rather than report a deadlock (see
	// loop.awaitParked).
	cb := l.addCallback(ctx)
	run := func() {
		f()
		l.dropCallback(cb)
	}
	if c := nearestLoopCtx(ctx); c != nil {
		stop := c.AfterFunc(run)
		return func() bool {
			if !stop() {
				return false
			}
			l.dropCallback(cb)
			return true
		}
	}
	n := &watch{ctx: ctx}
	n.fire = func() {
		run()
		l.unwatch(n)
	}
	l.addWatch(n)
	return func() bool {
		if !l.removeWatch(n, true) {
			return false
		}
		l.dropCallback(cb)
		return true
	}
}

// WithTimeout is WithDeadline(ctx, Now(ctx).Add(d)).
func WithTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if nearestLoop(ctx) == nil {
		return context.WithTimeout(ctx, d)
	}
	return WithDeadline(ctx, Now(ctx).Add(d))
}

// WithDeadline returns a copy of ctx that is cancelled at deadline t on the
// ctx's clock, when the returned cancel function is called, or when ctx is
// cancelled, whichever happens first. Inside a loop the deadline is on the
// loop's clock (virtual or real): at the deadline Err returns
// context.DeadlineExceeded and Deadline reports t, in this context and in
// every context derived from it; no goroutine is started for it. A parent
// deadline earlier than t wins. Outside any loop it is
// context.WithDeadline. Call cancel as soon as the work is done, to disarm
// the timer.
func WithDeadline(ctx context.Context, t time.Time) (context.Context, context.CancelFunc) {
	l := nearestLoop(ctx)
	if l == nil {
		return context.WithDeadline(ctx, t)
	}
	c := &loopCtx{parent: ctx, l: l, done: make(chan struct{})}
	if pd, ok := ctx.Deadline(); ok && !pd.After(t) {
		// The parent ends first; it will tell us, with its own error.
		c.propagate()
		return c, func() { c.cancel(context.Canceled, nil) }
	}
	c.deadline = t
	c.propagate()
	d := t.Sub(l.clock.Now())
	if d <= 0 {
		c.cancel(context.DeadlineExceeded, nil)
		return c, func() { c.cancel(context.Canceled, nil) }
	}
	timer := l.clock.AfterFunc(d, func() { c.cancel(context.DeadlineExceeded, nil) })
	c.mu.Lock()
	if c.Err() == nil {
		c.timer = timer
		timer = nil
	}
	c.mu.Unlock()
	if timer != nil { // cancelled by the parent meanwhile
		timer.Stop()
	}
	return c, func() { c.cancel(context.Canceled, nil) }
}
