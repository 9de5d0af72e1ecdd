package sched

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/sluice-go/sluice/vclock"
)

// A loop is the state of one Run.
type loop struct {
	clock   Clock
	virtual *vclock.Clock // nil under real time

	// Loop-thread state: touched only by the goroutine in Run and by the one
	// fiber it is running, which never overlap.
	runq             fiberQueue
	current          *Fiber
	running          atomic.Pointer[Fiber] // current, for reads off the loop (Waiter.Prepare's misuse check)
	nextID           uint64
	liveHead         *Fiber // every fiber not yet ended
	live, nonDaemon  int
	daemonsCancelled bool
	advancer         *Fiber // the fiber inside Advance, if any
	advanceTarget    time.Time
	probing          bool  // parked fibers are being resumed to report their site
	failure          error // a panic or deadlock that ends the run
	failed           []*Fiber
	idle             []*worker // coroutines free for the next fiber
	ended            atomic.Bool
	afterRun         *loopCtx // cancelled when the run ends; see AfterRun

	mu       sync.Mutex // guards the fields below, shared with other goroutines
	inbox    []*Fiber   // fibers woken from anywhere, in wake order
	spare    []*Fiber
	blocking int                         // Blocking calls in flight
	watched  map[watchee]context.Context // waits on contexts that cancel from their own goroutine
	sleeping bool                        // the loop is blocked on notify
	notify   chan struct{}
	inboxLen atomic.Int32 // len(inbox), read without mu to skip an empty drain
}

func newLoop(cfg config) *loop {
	l := &loop{notify: make(chan struct{}, 1)}
	l.afterRun = newLoopCtx(context.Background(), l)
	switch {
	case cfg.virtual != nil:
		l.virtual = cfg.virtual
		l.clock = virtualClock{cfg.virtual}
	case cfg.real != nil:
		l.clock = realClock{cfg.real}
	default:
		l.clock = realClock{clock.New()}
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
	f.nextLive = l.liveHead
	if l.liveHead != nil {
		l.liveHead.prev = f
	}
	l.liveHead = f
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
func (l *loop) park(f *Fiber, w *Waiter) {
	f.parkedOn = w
	for {
		if !f.w.yield(struct{}{}) {
			// Run is stopping this fiber. A wait it was in ends as a
			// cancellation, so the owner's OnCancel takes it out of its
			// queue and passes on what it held: nothing is lost.
			if w != nil {
				gen := w.gen()
				if w.state.CompareAndSwap(gen|statePending, gen|stateCancelled) && w.OnCancel != nil {
					w.OnCancel()
				}
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

// A watchee waits for the cancellation of a standard context, which the
// standard library delivers from a goroutine of its own: a Waiter parked on
// such a context, or a loop context whose parent is one. It stays watched
// until the wakes that cancellation causes are in the inbox.
type watchee any

// watch records w as waiting on ctx; see outsidePending.
func (l *loop) watch(w watchee, ctx context.Context) {
	l.mu.Lock()
	if l.watched == nil {
		l.watched = make(map[watchee]context.Context)
	}
	l.watched[w] = ctx
	l.mu.Unlock()
}

func (l *loop) unwatch(w watchee) {
	l.mu.Lock()
	delete(l.watched, w)
	l.mu.Unlock()
}

// outsidePending reports whether a wake may still arrive from outside the
// loop: a Blocking call in flight, or a watched context already done whose
// callback has not yet reached its watchee. Virtual time must not move then,
// nor may the loop report a deadlock.
func (l *loop) outsidePending() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.blocking > 0 || len(l.inbox) > 0 {
		return true
	}
	for _, ctx := range l.watched {
		if ctx.Err() != nil {
			return true // its wakes are on their way
		}
	}
	return false
}

// drain moves woken fibers from the inbox to the run queue.
func (l *loop) drain() {
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

// sleep blocks the loop until something arrives in the inbox (or a
// Blocking call ends).
func (l *loop) sleep() {
	l.mu.Lock()
	if len(l.inbox) > 0 {
		l.mu.Unlock()
		return
	}
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
	}
	l.setCurrent(f)
	_, ok := f.w.next()
	l.setCurrent(nil)
	if !ok || f.finished {
		w := f.w
		f.w = nil
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
	if f.prev != nil {
		f.prev.nextLive = f.nextLive
	} else {
		l.liveHead = f.nextLive
	}
	if f.nextLive != nil {
		f.nextLive.prev = f.prev
	}
	f.prev, f.nextLive = nil, nil
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
		if f := l.runq.pop(); f != nil {
			l.resume(f)
			continue
		}
		if l.nonDaemon == 0 {
			if l.live == 0 {
				return
			}
			if !l.daemonsCancelled {
				l.daemonsCancelled = true
				for f := l.liveHead; f != nil; f = f.nextLive {
					if c, ok := f.ctx.(*loopCtx); ok && f.daemon {
						c.cancel(context.Canceled, nil)
					}
				}
				continue
			}
			if l.outsidePending() {
				l.sleep()
				continue
			}
			return // daemons that parked again after cancellation: shutdown stops them
		}
		if l.virtual == nil {
			l.sleep()
			continue
		}
		if l.outsidePending() {
			l.sleep()
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
		if t, ok := l.virtual.Next(); ok {
			// One timer at a time: the fibers it wakes run before the
			// next timer fires, as they would at that instant.
			l.virtual.FireNext(t)
			continue
		}
		l.failure = l.deadlock()
	}
}

// deadlock builds the report of every parked fiber, resuming each once so
// that it records where it parked.
func (l *loop) deadlock() *DeadlockError {
	e := &DeadlockError{At: l.clock.Now()}
	var parked []*Fiber
	for f := l.liveHead; f != nil; f = f.nextLive {
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
	for l.liveHead != nil {
		f := l.liveHead
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
