package sched

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/sluice-go/sluice/internal/loopctx"
	"github.com/sluice-go/sluice/vclock"
)

// A loop is the state of one Run.
type loop struct {
	clock   loopctx.Clock
	virtual *vclock.Clock // nil under real time

	// Loop-thread state: touched only by the goroutine in Run and by the one
	// fiber it is running, which never overlap.
	runq             fiberQueue
	rng              *rand.PCG // picks the next runnable fiber under WithSeed; nil: FIFO
	current          *Fiber
	running          atomic.Pointer[Fiber] // current, for reads off the loop (waiter.Prepare's misuse check)
	nextID           uint64
	alive            list[Fiber] // every fiber not yet ended, newest first
	live, nonDaemon  int
	daemonsCancelled bool
	advancer         *Fiber // the fiber inside Advance, if any
	advanceTarget    time.Time
	probing          bool  // parked fibers are being resumed to report their site
	failure          error // a panic or deadlock that ends the run
	failed           []*Fiber
	idle             []*worker // coroutines free for the next fiber
	ended            atomic.Bool
	afterRun         *loopCtx          // cancelled when the run ends; see AfterRun
	scratch          []context.Context // watchEnding's copy of the settled watches' contexts

	mu        sync.Mutex // guards the fields below, shared with other goroutines
	inbox     []*Fiber   // fibers woken from anywhere, in wake order
	spare     []*Fiber
	blocking  int                    // Blocking calls in flight
	watched   watchList              // settled watches (see watch), in registration order
	callbacks map[*callback]struct{} // AfterFunc callbacks not yet returned nor stopped
	cbDone    uint64                 // callbacks returned or stopped so far
	sleeping  bool                   // the loop is blocked on notify
	notify    chan struct{}
	inboxLen  atomic.Int32 // len(inbox), read without mu to skip an empty drain
	nblocking atomic.Int32 // blocking, read without mu (see awaitOutside)
	nwatched  atomic.Int32 // watched.len, read without mu to skip an empty settle
	poke      func()       // l.signal, bound once: the callback of every watch

	// Timers of the virtual clock that another goroutine is firing: the
	// clock's count (vwake.Watch), or noFires under real time. awaiting is
	// set while awaitOutside waits for a wake and looks at that count,
	// so that the fire's end (fireEnded) knows to signal.
	firing   *atomic.Int32
	awaiting atomic.Bool

	// Test hooks, nil outside this package's tests; a fiber sets them
	// before the Blocking calls or fires they watch.
	hookIdle         func() // the loop is about to look for wakes from the outside
	hookBlockingWoke func() // a Blocking goroutine woke its fiber; its count has not dropped yet
}

func newLoop(cfg config) *loop {
	l := &loop{notify: make(chan struct{}, 1), firing: &noFires}
	l.poke = l.signal
	if cfg.seeded {
		// Two streams: the run queue is drawn on the loop's goroutine, the
		// timer ties under the clock's lock, possibly from elsewhere.
		l.rng = rand.NewPCG(cfg.seed, 0x5eed0f5c4ed)
	}
	l.afterRun = newLoopCtx(context.Background(), l)
	switch {
	case cfg.virtual != nil:
		l.virtual = cfg.virtual
		l.clock = virtualClock{cfg.virtual}
	case cfg.real != nil:
		l.clock = loopctx.Real(cfg.real)
	default:
		l.clock = loopctx.Real(clock.New())
	}
	return l
}

// nearestLoop returns the loop ctx belongs to, or nil.
func nearestLoop(ctx context.Context) *loop {
	if c, ok := ctx.(*loopCtx); ok {
		return c.l
	}
	if c, _ := ctx.Value(ctxKey{}).(*loopCtx); c != nil {
		return c.l
	}
	return nil
}

func (l *loop) spawn(ctx context.Context, fn func(context.Context) error, daemon bool) *Fiber {
	if l.ended.Load() {
		panic("sched: starting a fiber in a loop whose Run has returned")
	}
	l.nextID++
	f := &Fiber{l: l, id: l.nextID, daemon: daemon, ctx: ctx, fn: fn}
	f.joiners = f.joiner1[:0] // the usual single joiner needs no allocation
	l.alive.pushFront(f)
	l.live++
	if !daemon {
		l.nonDaemon++
	}
	l.drain() // fibers woken earlier run first: FIFO
	l.runq.push(f)
	return f
}

// ready makes f runnable. Safe from any goroutine.
func (l *loop) ready(f *Fiber) {
	l.mu.Lock()
	l.inbox = append(l.inbox, f)
	l.inboxLen.Store(int32(len(l.inbox)))
	sleeping := l.sleeping
	l.mu.Unlock()
	if sleeping {
		l.signal()
	}
}

func (l *loop) signal() {
	select {
	case l.notify <- struct{}{}:
	default:
	}
}

// park suspends the running fiber f until the loop resumes it. w, if not
// nil, is the wait it parks in, for deadlock reports.
func (l *loop) park(f *Fiber, w *waiter) {
	f.parkedOn = w
	for {
		if !f.yield(struct{}{}) {
			// Run is stopping this fiber. A wait it was in ends as a
			// cancellation, so the owner's OnCancel takes it out of its
			// queue and passes on what it held: nothing is lost.
			// Nobody waits to be resumed: this fiber unwinds instead.
			if w != nil {
				w.tryCancel(w.gen())
			}
			panic(errKilled)
		}
		if !l.probing {
			break
		}
		f.site = callerSite()
	}
	f.parkedOn = nil
}

// A watch is a wait on a standard context (context.WithCancel and the like
// over a loop context): a waiter parked on one, a loop context whose parent
// is one, or a sched.AfterFunc on one. The standard library reports such a
// context's end only on a goroutine of its own (context.AfterFunc), which
// reaches the loop whenever the Go scheduler runs it; so the loop does not
// wait for that report, and a cancel lands at a fixed point of the
// schedule: once cancel has returned on the loop's goroutine, the wait has
// ended before any other fiber runs; a cancel from another goroutine lands
// no later than the first scheduling decision after it returned.
//
// Two kinds of watch keep that promise:
//
//   - linked: the context is a standard child made directly from a loop
//     context (through value wrappers only), the usual
//     context.WithTimeout(ctx, d) in a fiber. Its every end runs this
//     package's code on the cancelling goroutine (see afterFunc), which
//     fires the watch there and then. The watch sits on its registration,
//     and costs nothing per scheduling decision.
//   - settled: any other standard context (one further down a chain of
//     standard contexts, one under context.WithoutCancel, a type of the
//     caller's). Nothing of ours runs when it ends, so before every
//     scheduling decision the loop checks each such watch (see settle):
//     O(settled watches) per decision. The standard library's goroutine
//     only wakes a sleeping loop.
type watch struct {
	ln   node // in a watchList, guarded as fired is; first, see list
	ctx  context.Context
	fire func()      // ends the wait; runs once
	stop func() bool // the context.AfterFunc that wakes the loop; settled watches only
	af   *afterFunc  // the registration a linked watch sits on; nil: settled
	// Guarded by loop.mu (settled) or af.c.mu (linked).
	fired  bool
	listed bool
}

// watchList is a doubly linked list of watches in registration order, the
// order in which they fire: deterministic, unlike a map's.
type watchList struct {
	list[watch]
	len int
}

func (q *watchList) push(n *watch) {
	q.pushBack(n)
	n.listed = true
	q.len++
}

func (q *watchList) remove(n *watch) {
	q.list.remove(n)
	n.listed = false
	q.len--
}

// takeAll empties q, marking every watch fired, and returns them, still
// chained in order, for fireAll (run without the list's lock).
func (q *watchList) takeAll() *watch {
	head := q.list.takeAll()
	for n := head; n != nil; n = next(n) {
		n.fired, n.listed = true, false
	}
	q.len = 0
	return head
}

// fireAll fires a chain returned by takeAll. Nobody else touches an
// unlisted watch's links, so the chain needs no lock.
func fireAll(head *watch) {
	for n := head; n != nil; {
		nx := next(n)
		unlink(n)
		n.fire()
		n = nx
	}
}

// watch registers a wait on ctx, ended by fire once ctx is done. The owner
// calls unwatch when the wait is over, whether fire ran or not.
func (l *loop) watch(ctx context.Context, fire func()) *watch {
	n := &watch{ctx: ctx, fire: fire}
	l.addWatch(n)
	return n
}

// addWatch links n to the registration of its context if it has one on
// this loop, and else lists it for settle.
func (l *loop) addWatch(n *watch) {
	if a := linkedAfterFunc(n.ctx); a != nil && a.c.l == l && a.link(n) {
		return
	}
	// Registered before n is published: a settle on another goroutine may
	// fire n, and its owner unwatch it (reading n.stop), at once.
	n.stop = context.AfterFunc(n.ctx, l.poke)
	l.mu.Lock()
	l.watched.push(n)
	l.nwatched.Store(int32(l.watched.len))
	l.mu.Unlock()
}

// link puts n on a's list, unless a has run or stopped (its child is done
// or ending: n is settled instead).
func (a *afterFunc) link(n *watch) bool {
	c := a.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if !a.listed || c.Err() != nil {
		return false
	}
	n.af = a
	a.watches.push(n)
	return true
}

// unwatch ends the watch n; it may be called more than once.
func (l *loop) unwatch(n *watch) { l.removeWatch(n, false) }

// removeWatch unlinks n. With prevent, it also stops n from firing later,
// and reports whether it did (false: fire has started or n was removed).
func (l *loop) removeWatch(n *watch, prevent bool) bool {
	if a := n.af; a != nil {
		a.c.mu.Lock()
		defer a.c.mu.Unlock()
		if !n.listed || (prevent && n.fired) {
			return false
		}
		n.fired = n.fired || prevent
		a.watches.remove(n)
		return true
	}
	l.mu.Lock()
	if !n.listed || (prevent && n.fired) {
		l.mu.Unlock()
		return false
	}
	n.fired = n.fired || prevent
	l.watched.remove(n)
	l.nwatched.Store(int32(l.watched.len))
	l.mu.Unlock()
	n.stop()
	return true
}

// settle fires every settled watch (see watch) whose context is done, in
// registration order,
// and repeats while firing ends more contexts (a loop context whose watched
// parent ended cancels its own children). It runs before every scheduling
// decision, and also right where a cancel of a loop context (or of a
// standard context directly under one) returns, so most cancels land even
// before cancel returns. Safe on any goroutine; fire functions are.
func (l *loop) settle() {
	for l.nwatched.Load() > 0 {
		var buf [8]func()
		fire := buf[:0]
		l.mu.Lock()
		for n := l.watched.front(); n != nil; n = next(n) {
			if !n.fired && n.ctx.Err() != nil {
				n.fired = true
				fire = append(fire, n.fire)
			}
		}
		l.mu.Unlock()
		if len(fire) == 0 {
			return
		}
		for _, f := range fire {
			f()
		}
	}
}

// noFires is the count of fires in flight of a loop under real time:
// always zero (only read).
var noFires atomic.Int32

// awaitOutside waits for a wake that may still arrive from outside the
// loop, a Blocking call in flight, a timer of the virtual clock that
// another goroutine has taken off the queue and is firing (vclock's
// Advance on a WithVirtualClock clock), or wakes already in the inbox, and
// reports whether there was one; false means none can come, so virtual time
// may move or the loop report a deadlock. Watched contexts: the drain at
// the top of the same iteration has just settled every one that was done,
// one scan per decision; one that is ending (done since, or inheriting an
// ancestor's end that the standard library has yet to carry down, see
// watchEnding) counts as a wake still to come, since its watch's poke will
// wake the loop. Other waits get no look here, which would cost O(waits)
// per decision: a cancel on another goroutine ends them on that goroutine,
// and one caught halfway (the context done, its wake not yet in the inbox)
// lands once that goroutine goes on, after time may have moved; the loop
// waits for it before it reports a deadlock (see awaitParked).
//
// Why the look and the sleep are one step under l.mu: a Blocking goroutine
// wakes its fiber and only then drops the count, and the fiber may have run
// on and parked again meanwhile. Had the count dropped between a look that
// saw the call in flight and a sleep taken apart from it, the loop would
// sleep with nothing left to wake it: the goroutine signals only a loop
// already marked asleep. A fire's count drops without l.mu (the loop fires
// most timers itself, and must not take a lock for that); awaiting stands
// in: set before the look at the count, read by fireEnded after the count
// dropped, so that one of the two sees the other.
func (l *loop) awaitOutside() bool {
	if l.hookIdle != nil {
		l.hookIdle()
	}
	// The common case without the lock: no Blocking call in flight (only
	// a fiber starts one, and none runs now), no fire in flight, no wake
	// in the inbox and no settled watch. In this order: a Blocking
	// goroutine or a fire wakes its fiber before its count drops, so a
	// count seen at zero comes with that wake seen.
	if l.nblocking.Load() == 0 && l.firing.Load() == 0 && l.inboxLen.Load() == 0 && l.nwatched.Load() == 0 {
		return false
	}
	// Outside l.mu: it calls the watched contexts' own methods. A context
	// that ends after this look wakes the loop through its watch's poke,
	// which signals whether or not the loop sleeps yet.
	ending := l.nwatched.Load() > 0 && l.watchEnding()
	l.mu.Lock()
	if len(l.inbox) > 0 {
		l.mu.Unlock()
		return true
	}
	l.awaiting.Store(true)
	if l.blocking == 0 && l.firing.Load() == 0 && !ending {
		// A fire whose count has dropped delivered its wake first,
		// through ready, which takes l.mu: before the inbox's look,
		// then. A count of zero means no wake is on its way.
		l.awaiting.Store(false)
		l.mu.Unlock()
		return false
	}
	l.sleepLocked()
	l.awaiting.Store(false)
	return true
}

// watchEnding reports whether a settled watch's context is ending (see
// ending): done since the last settle, or inheriting the end of an ancestor
// that is done, which the standard library carries down on a goroutine of
// its own (a standard child of a wrapper that hides a loop context's
// AfterFunc, ended by that context's timer). Its end is on its way, and
// its watch's poke (context.AfterFunc on the context) signals the loop when
// it lands: virtual time must not move, nor a deadlock be reported, before
// then. O(settled watches), as settle is; run only when the loop is idle.
// Loop goroutine only (it uses l.scratch).
func (l *loop) watchEnding() bool {
	ctxs := l.scratch[:0]
	l.mu.Lock()
	for n := l.watched.front(); n != nil; n = next(n) {
		if !n.fired {
			ctxs = append(ctxs, n.ctx)
		}
	}
	l.mu.Unlock()
	found := false
	for i, ctx := range ctxs {
		if !found && ending(ctx) {
			found = true
		}
		ctxs[i] = nil
	}
	l.scratch = ctxs[:0]
	return found
}

// awaitParked is the idle loop's last look before it reports a deadlock:
// whether a wake is still on its way to a parked fiber from a goroutine
// that has begun to deliver it, and if so it waits for it and reports
// true. Two signs, for each parked fiber's wait:
//
//   - the waiter is no longer pending: a Wake or a cancellation has won it
//     on another goroutine, which has yet to put the fiber in the inbox
//     (an OnCancel may run in between, taking locks);
//   - the wait's context has ended or is ending (see ending): a cancel on
//     another goroutine has closed it and not yet reached the code that
//     ends the waits on it (context.WithCancel's cancel closes the context
//     first, then tells its parent's AfterFunc registration), or the
//     standard library's goroutine has yet to carry an ancestor's end down.
//
// And one sign outside the fibers: an AfterFunc callback, not returned yet,
// whose context has ended or is ending (a cancel on another goroutine runs
// it there, and it may wake a fiber waiting on something else).
//
// Each wake is delivered through ready, which signals a loop marked asleep
// under l.mu, or through a watch's poke, which always signals, or, for a
// callback that woke nobody, through its return (dropCallback); all come
// after the sign this looked at, so the sleep below cannot miss them. A
// wait whose context has not begun to end is a deadlock: the loop cannot
// know of a goroutine that will cancel it later. O(fibers + callbacks), on
// the path to a DeadlockError only.
func (l *loop) awaitParked() bool {
	found := false
	for f := l.alive.front(); f != nil && !found; f = next(f) {
		w := f.parkedOn
		if w == nil {
			continue
		}
		found = w.state.Load()&stateMask != statePending ||
			(w.waitCtx != nil && ending(w.waitCtx))
	}
	// An AfterFunc callback whose context has ended, not returned yet,
	// may still wake a fiber: a cancel on another goroutine runs it there.
	// Its return wakes the loop (dropCallback), when it woke nobody; the
	// count tells one that returned between this look and the sleep.
	l.mu.Lock()
	cbDone := l.cbDone
	var ctxs []context.Context
	if !found {
		for cb := range l.callbacks {
			ctxs = append(ctxs, cb.ctx)
		}
	}
	l.mu.Unlock()
	for _, ctx := range ctxs {
		if ending(ctx) {
			found = true
			break
		}
	}
	if !found {
		return false
	}
	l.mu.Lock()
	if len(l.inbox) > 0 || l.cbDone != cbDone {
		l.mu.Unlock()
		return true
	}
	l.sleepLocked()
	return true
}

// A callback is one AfterFunc registration, listed on its loop from
// AfterFunc until its function has returned or stop has unregistered it.
type callback struct{ ctx context.Context }

func (l *loop) addCallback(ctx context.Context) *callback {
	cb := &callback{ctx: ctx}
	l.mu.Lock()
	if l.callbacks == nil {
		l.callbacks = make(map[*callback]struct{})
	}
	l.callbacks[cb] = struct{}{}
	l.mu.Unlock()
	return cb
}

// dropCallback unlists cb, once; it wakes a loop asleep in awaitParked,
// which may be waiting for this callback (one that woke no fiber, say).
func (l *loop) dropCallback(cb *callback) {
	l.mu.Lock()
	if _, ok := l.callbacks[cb]; !ok {
		l.mu.Unlock()
		return
	}
	delete(l.callbacks, cb)
	l.cbDone++
	sleeping := l.sleeping
	l.mu.Unlock()
	if sleeping {
		l.signal()
	}
}

// fireEnded runs, on the goroutine that fired, when the virtual clock's
// count of fires in flight drops to zero (vwake.Watch): it wakes the loop
// if awaitOutside waits for such a fire. Its wake, if any, was delivered
// first, and ready signalled for it; this signal is for a fire that woke
// no fiber of this loop. A signal the loop no longer waits for makes its
// next sleep return early, and every sleep looks again.
func (l *loop) fireEnded() {
	if l.awaiting.Load() {
		l.signal()
	}
}

// drain moves woken fibers from the inbox to the run queue.
// Watched contexts that ended are settled first: their waits end at this
// scheduling decision, whatever goroutine ended them.
func (l *loop) drain() {
	l.settle()
	if l.inboxLen.Load() == 0 {
		return
	}
	l.mu.Lock()
	in := l.inbox
	l.inbox = l.spare[:0]
	l.inboxLen.Store(0)
	l.mu.Unlock()
	for i, f := range in {
		l.runq.push(f)
		in[i] = nil
	}
	l.spare = in
}

// sleep blocks the loop until something arrives in the inbox: under real
// time, a timer's wake or one from another goroutine.
func (l *loop) sleep() {
	l.mu.Lock()
	if len(l.inbox) > 0 {
		l.mu.Unlock()
		return
	}
	l.sleepLocked()
}

// sleepLocked marks the loop asleep, releases l.mu and blocks until signal;
// ready and the end of a Blocking call signal a loop marked asleep.
func (l *loop) sleepLocked() {
	l.sleeping = true
	l.mu.Unlock()
	<-l.notify
	l.mu.Lock()
	l.sleeping = false
	l.mu.Unlock()
}

// maxIdleWorkers bounds the coroutines kept for reuse: enough for bursts of
// short fibers, without holding thousands of stacks after a large fan-out.
const maxIdleWorkers = 256

func (l *loop) resume(f *Fiber) {
	if f.w == nil {
		if n := len(l.idle); n > 0 {
			f.w = l.idle[n-1]
			l.idle = l.idle[:n-1]
		} else {
			f.w = newWorker()
		}
		f.w.f = f
		f.next = f.w.next
	}
	l.setCurrent(f)
	_, ok := f.next()
	l.setCurrent(nil)
	if !ok || f.finished {
		w := f.w
		f.w, f.next, f.yield = nil, nil, nil
		w.f = nil
		if ok && len(l.idle) < maxIdleWorkers {
			l.idle = append(l.idle, w)
		} else if ok {
			w.stop()
		}
		l.end(f)
	}
}

func (l *loop) end(f *Fiber) {
	l.alive.remove(f)
	l.live--
	if !f.daemon {
		l.nonDaemon--
		if f.err != nil && f.err != errKilled {
			l.failed = append(l.failed, f)
		}
	}
	if f.panicked && l.failure == nil {
		l.failure = &PanicError{Fiber: f.id, Func: f.funcName(), Value: f.panicVal, Stack: f.stack}
	}
	f.finish()
}

// run is the scheduler: run what is runnable, FIFO; when nothing is, decide
// between finishing, waiting for the outside, moving virtual time, and
// reporting a deadlock.
func (l *loop) run() {
	for l.failure == nil {
		l.drain()
		if f := l.pick(); f != nil {
			l.resume(f)
			continue
		}
		if l.nonDaemon == 0 {
			if l.live == 0 {
				return
			}
			if !l.daemonsCancelled {
				l.daemonsCancelled = true
				for f := l.alive.front(); f != nil; f = next(f) {
					if c, ok := f.ctx.(*loopCtx); ok && f.daemon {
						c.cancel(context.Canceled, nil)
					}
				}
				continue
			}
			if l.awaitOutside() {
				continue
			}
			return // daemons that parked again after cancellation: shutdown stops them
		}
		if l.virtual == nil {
			l.sleep()
			continue
		}
		if l.awaitOutside() {
			continue
		}
		if l.advancer != nil {
			if !l.virtual.FireNext(l.advanceTarget) {
				l.virtual.AdvanceTo(l.advanceTarget)
				l.runq.push(l.advancer)
				l.advancer = nil
			}
			continue
		}
		// One timer at a time: the fibers it wakes run before the next
		// timer fires, as they would at that instant.
		if l.virtual.FireNext(endOfTime) {
			continue
		}
		// No timer: another goroutine may have taken the last one since
		// the look above, and be firing it. The count rose as it took it,
		// under the clock's lock that FireNext took after: look again.
		if l.awaitOutside() {
			continue
		}
		// A fire that ended meanwhile may have ended a watched context
		// instead of waking a fiber through the inbox: settle it.
		if l.drain(); l.runq.size > 0 {
			continue
		}
		// A wake that another goroutine has begun to deliver (a cancel
		// in flight) is no deadlock: wait for it.
		if l.awaitParked() {
			continue
		}
		l.failure = l.deadlock()
	}
}

// endOfTime is a limit beyond every deadline: FireNext(endOfTime) fires the
// earliest timer, whenever it is due.
var endOfTime = time.Unix(1<<62, 0)

// pick takes the next fiber to run from the run queue: the oldest under
// FIFO, one drawn from the seeded PRNG under WithSeed. Every fiber in the
// queue is runnable at the same instant (time moves only when it is empty),
// so any order is one a real scheduler could produce.
func (l *loop) pick() *Fiber {
	if l.rng != nil && l.runq.size > 1 {
		// Lemire's multiply-shift maps 32 random bits onto [0, size):
		// the bias, size/2³², is far below anything a schedule shows,
		// and it costs no division and no interface call.
		i := int(uint64(uint32(l.rng.Uint64())) * uint64(l.runq.size) >> 32)
		return l.runq.take(i)
	}
	return l.runq.pop()
}

// deadlock builds the report of every parked fiber, resuming each once so
// that it records where it parked.
func (l *loop) deadlock() *DeadlockError {
	e := &DeadlockError{At: l.clock.Now()}
	var parked []*Fiber
	for f := l.alive.front(); f != nil; f = next(f) {
		parked = append(parked, f)
	}
	sort.Slice(parked, func(i, j int) bool { return parked[i].id < parked[j].id })
	l.probing = true
	for _, f := range parked {
		if f.w == nil {
			continue // runnable but never started: cannot be, when idle
		}
		l.setCurrent(f)
		f.w.next()
		l.setCurrent(nil)
	}
	l.probing = false
	for _, f := range parked {
		p := ParkedFiber{ID: f.id, Daemon: f.daemon, Reason: "unknown wait", Site: f.site}
		if w := f.parkedOn; w != nil {
			p.Reason = w.Reason
			if w.N != 0 {
				p.Reason = fmt.Sprintf("%s n=%d", w.Reason, w.N)
			}
		}
		e.Parked = append(e.Parked, p)
	}
	return e
}

// shutdown stops every fiber still alive, outermost cleanup of Run; it also
// runs when a fiber's runtime.Goexit unwinds the goroutine of Run.
func (l *loop) shutdown(root *loopCtx) {
	l.ended.Store(true)
	l.setCurrent(nil)
	root.cancel(context.Canceled, nil)
	for l.alive.front() != nil {
		f := l.alive.front()
		if w := f.w; w != nil {
			l.setCurrent(f)
			w.stop() // a parked fiber unwinds from park with errKilled
			l.setCurrent(nil)
			f.w = nil
		}
		l.end(f)
	}
	for _, w := range l.idle {
		w.stop()
	}
	l.idle = nil
	l.runq = fiberQueue{}
	l.afterRun.cancel(context.Canceled, nil) // AfterRun callbacks: the run has ended
}

// setCurrent records the fiber the loop runs (nil: none).
func (l *loop) setCurrent(f *Fiber) {
	l.current = f
	l.running.Store(f)
}

// callerSite returns file:line of the first caller outside this module's
// library packages, as seen from a parked fiber.
func callerSite() string {
	var pcs [64]uintptr
	n := runtime.Callers(3, pcs[:])
	frames := runtime.CallersFrames(pcs[:n])
	first := ""
	for {
		fr, more := frames.Next()
		loc := fmt.Sprintf("%s:%d", filepath.Base(fr.File), fr.Line)
		if first == "" {
			first = loc
		}
		if !isLibraryFrame(fr) {
			return loc
		}
		if !more {
			return first
		}
	}
}

// modulePath is this module's import path, read from this function's own
// symbol: a deadlock report looks past every frame of the module's library
// packages (any package of the module, outside its tests), so a new package
// needs no list to be kept up to date.
var modulePath = func() string {
	pc, _, _, _ := runtime.Caller(0)
	name := runtime.FuncForPC(pc).Name() // "<module>/sched.init.func1"
	return name[:strings.LastIndex(name, "/")]
}()

func isLibraryFrame(fr runtime.Frame) bool {
	if strings.HasPrefix(fr.Function, "runtime.") || strings.HasPrefix(fr.Function, "iter.") {
		return true
	}
	if strings.HasSuffix(fr.File, "_test.go") {
		return false
	}
	// A program's own functions are named main.*, never by module path.
	return strings.HasPrefix(fr.Function, modulePath+"/")
}

// fiberQueue is a FIFO ring of fibers.
type fiberQueue struct {
	buf        []*Fiber
	head, size int
}

func (q *fiberQueue) push(f *Fiber) {
	if q.size == len(q.buf) {
		n := 2 * len(q.buf)
		if n == 0 {
			n = 16
		}
		buf := make([]*Fiber, n)
		for i := 0; i < q.size; i++ {
			buf[i] = q.buf[(q.head+i)%len(q.buf)]
		}
		q.buf, q.head = buf, 0
	}
	q.buf[(q.head+q.size)%len(q.buf)] = f
	q.size++
}

// take removes and returns the i-th fiber from the head (0 ≤ i < size); the
// head takes its place.
func (q *fiberQueue) take(i int) *Fiber {
	j := (q.head + i) % len(q.buf)
	q.buf[q.head], q.buf[j] = q.buf[j], q.buf[q.head]
	return q.pop()
}

func (q *fiberQueue) pop() *Fiber {
	if q.size == 0 {
		return nil
	}
	f := q.buf[q.head]
	q.buf[q.head] = nil
	q.head = (q.head + 1) % len(q.buf)
	q.size--
	return f
}
