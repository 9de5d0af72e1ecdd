package sched

import (
	"context"
	"iter"
	"reflect"
	"runtime"
	"runtime/debug"
	"sync"
)

// A Fiber is one thread of control in a loop, started by Go or Daemon. Its
// methods are safe for concurrent use.
type Fiber struct {
	live node // in the loop's list of live fibers; first, see list

	// Loop-thread state. Why this order: what a resume, a park and a
	// Sleep touch fills the first cache line of the fiber; with 100k
	// fibers asleep, each wake finds it out of cache. The flags share a
	// word, so that the fiber stays in the 224-byte size class.
	w        *worker                 // the coroutine running it, from its first resume
	next     func() (struct{}, bool) // w.next and the coroutine's yield, copied: a
	yield    func(struct{}) bool     // resume and a park then skip the worker's memory
	parkedOn *waiter                 // the wait it is parked in, nil if runnable or running
	sleep    *sleeper                // Sleep's wait, made by the first Sleep and kept
	finished bool                    // fn has returned (or panicked, or was stopped)
	panicked bool
	daemon   bool

	l        *loop
	id       uint64
	ctx      context.Context
	fn       func(context.Context) error
	site     string // where it parked, filled in only for a DeadlockError
	panicVal any
	stack    []byte

	mu      sync.Mutex // guards the fields below, read by Wait from any goroutine
	ended   bool
	waited  bool
	err     error
	joiners []*joiner
	joiner1 [1]*joiner // backing store for the first joiner
}

// ID returns the fiber's number, unique within its loop; main is 1.
func (f *Fiber) ID() uint64 { return f.id }

// Go starts fn in a new fiber of ctx's loop and returns at once; the new
// fiber runs after the fibers already runnable. Run does not return before it
// ends. Go panics if ctx belongs to no loop or fn is nil: both are mistakes a
// caller can always avoid.
func Go(ctx context.Context, fn func(ctx context.Context) error) *Fiber {
	return spawn(ctx, fn, false, "sched.Go")
}

// Daemon is Go for a fiber that never keeps a run open: when only daemons
// remain, Run cancels their contexts, lets them finish, and returns. A
// daemon that parks again after its cancellation is stopped (its deferred
// calls run). Use it for background work that should live only as long as
// the program's real work (a poller, a metrics flusher). Limiters and
// tickers need no daemon: they arm a timer only while someone waits.
func Daemon(ctx context.Context, fn func(ctx context.Context) error) *Fiber {
	return spawn(ctx, fn, true, "sched.Daemon")
}

func spawn(ctx context.Context, fn func(context.Context) error, daemon bool, what string) *Fiber {
	if fn == nil {
		panic(what + " with a nil func")
	}
	l := nearestLoop(ctx)
	if l == nil {
		panic(what + " called with a context that is not inside a sched.Run loop")
	}
	if daemon {
		c := newLoopCtx(ctx, l)
		ctx = c
	}
	return l.spawn(ctx, fn, daemon)
}

// A worker is a coroutine that runs fibers one after another: a fiber that
// ends hands its coroutine back to the loop's pool, so starting a fiber
// usually creates no goroutine.
type worker struct {
	next func() (struct{}, bool)
	stop func()
	f    *Fiber // the fiber it runs now
}

func newWorker() *worker {
	w := &worker{}
	w.next, w.stop = iter.Pull(w.body)
	return w
}

// body is the coroutine: run the assigned fiber, report it finished by
// yielding, and run the next one assigned when resumed.
func (w *worker) body(yield func(struct{}) bool) {
	for {
		f := w.f
		f.yield = yield
		f.run()
		f.finished = true
		if !yield(struct{}{}) {
			return
		}
	}
}

// run calls the fiber's function, turning a panic into the fiber's record.
// runtime.Goexit is not caught: it ends the coroutine and, through it, the
// goroutine of Run (what t.Fatal inside a fiber must do).
func (f *Fiber) run() {
	defer func() {
		if r := recover(); r != nil {
			if r == errKilled {
				f.setErr(errKilled)
				return
			}
			f.panicked, f.panicVal, f.stack = true, r, debug.Stack()
		}
	}()
	f.setErr(f.fn(f.ctx))
}

func (f *Fiber) setErr(err error) {
	f.mu.Lock()
	f.err = err
	f.mu.Unlock()
}

// funcName names the fiber's function, for panic reports.
func (f *Fiber) funcName() string {
	if fn := runtime.FuncForPC(reflect.ValueOf(f.fn).Pointer()); fn != nil {
		return fn.Name()
	}
	return "?"
}

// Wait blocks until f ends and returns f's error. Inside a loop it parks the
// calling fiber. If ctx ends first it returns ctx.Err() and f runs on.
func (f *Fiber) Wait(ctx context.Context) error {
	f.mu.Lock()
	if f.ended {
		f.waited = true
		err := f.err
		f.mu.Unlock()
		return err
	}
	f.mu.Unlock()
	if cur := nearestLoop(ctx); cur != nil && cur.current == f {
		panic("sched: a fiber cannot Wait for itself")
	}
	j := joiners.Get().(*joiner)
	j.f = f
	j.w.Prepare(ctx)
	f.mu.Lock()
	if f.ended {
		f.waited = true
		err := f.err
		f.mu.Unlock()
		j.f = nil
		joiners.Put(j)
		return err
	}
	f.joiners = append(f.joiners, j)
	f.mu.Unlock()
	err := j.w.Wait(ctx)
	j.f = nil
	joiners.Put(j)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.waited = true
	return f.err
}

// A joiner is one Fiber.Wait in progress, pooled with its OnCancel bound.
type joiner struct {
	w waiter
	f *Fiber
}

var joiners = sync.Pool{New: func() any {
	j := &joiner{}
	j.w.Reason = "Fiber.Wait"
	j.w.OnCancel = j.cancel
	return j
}}

// cancel takes the joiner out of its fiber's list when its wait is
// cancelled.
func (j *joiner) cancel() {
	f := j.f
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, o := range f.joiners {
		if o == j {
			f.joiners = append(f.joiners[:i], f.joiners[i+1:]...)
			return
		}
	}
}

// finish records that f ended and wakes its joiners.
func (f *Fiber) finish() {
	f.mu.Lock()
	f.ended = true
	js := f.joiners
	f.joiners = nil
	f.mu.Unlock()
	for _, j := range js {
		j.w.Wake()
	}
}
