package sched

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
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
