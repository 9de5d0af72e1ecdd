// Package queue is the one parking core of Sluice: a count of free units and
// the callers waiting for them, served in strict FIFO order with direct
// hand-off. semaphore.Semaphore, ticker.Ticker and ratelimiter.Limiter are
// built on it.
package queue

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sluice-go/sluice/internal/alarm"
	"github.com/sluice-go/sluice/internal/loopctx"
	"github.com/sluice-go/sluice/internal/waitq"
	_ "github.com/sluice-go/sluice/sched" // its init installs loopctx's answers: the Waiter that parks a caller
)

// A Queue is a count of free units and the callers waiting for them,
// served in strict FIFO order with direct hand-off. It is the one parking
// core of Sluice: a Semaphore is a Queue whose units are permits given back
// by Release (up to its size); ticker.Ticker and
// ratelimiter.Limiter are Queues whose units a Source produces over time
// (boundaries of a grid, tokens of a bucket).
//
// Everything about waiting is the Queue's and is written once here: the
// two-phase park (bind the caller, then publish it), the hand-off of units
// to the head under the queue's lock, cancellation (a waiter leaves from
// anywhere in the queue, and its leaving may let those behind it go), the
// hand-back (a caller whose ctx ended before Acquire returned gives its
// grant back), Close, the refill alarm (armed, while a head waits, for the
// instant its Source says the head's units are due, and cleared when nobody
// waits), and for a Settler the hand-over of the state to its lock-free word
// and back. An owner keeps only its own accounting, in its Source.
//
// A Queue is safe for use by many goroutines and fibers at once. The zero
// value is an empty queue with no free units and no Source.
type Queue struct {
	src       Source
	settle    Settler      // src, when it is a Settler; else nil
	settled   bool         // settle has the state (and the free units) in its word; guarded by mu
	alarm     *alarm.Alarm // calls refill when the head's units are due; nil without a Source
	reason    string       // what a parked caller waits for, in a sched.DeadlockError
	failEarly bool         // see Config.FailEarly

	mu     sync.Mutex                   // guards the fields below and the Source's state
	avail  int64                        // free units
	queue  waitq.Queue[waiter, *waiter] // FIFO of parked callers
	closed error                        // set once by Close; nil while open
}

// A Source produces a Queue's units lazily, from its clock: nothing ticks
// while nobody looks. Every method but Now is called with the queue's lock
// held, which also guards the Source's own state; they must not block. A
// Source says what its units are and when they come; the queue does the
// rest (the waiting, the alarm, and with a Settler, the hand-over).
type Source interface {
	// Now reads the source's clock. The queue calls it before taking its
	// lock, so that a clock read is never part of the critical section; a
	// reading that is stale by the time the lock is held must do no harm.
	Now() time.Time
	// Fill returns avail brought up to date at now: what the source has
	// produced since it last gave units, added. want is the number of units
	// about to be asked for (a caller's n, the head waiter's n; 0 when only
	// looking); waiting reports whether anyone waits.
	Fill(now time.Time, avail, want int64, waiting bool) int64
	// Due returns the instant at which n units will be free, avail being
	// free now (avail < n), if nobody else takes any: the queue arms its
	// alarm for it while a head of n waits, and with Config.FailEarly
	// fails at once a wait whose ctx ends before it. ok is false when the
	// Source cannot say they will ever be there (a shared bucket whose
	// policy refuses n): such a wait fails at once with FailEarly, and at
	// is when the alarm asks the Source again.
	Due(now time.Time, avail, n int64) (at time.Time, ok bool)
	// Take is told of a grant of n units and returns a mark that Acquire
	// reports to its caller (a ticker's boundary).
	Take(n int64) (mark int64)
	// Return is told that n units of a grant with that mark, made at
	// granted, came back at now: its caller's ctx ended before Acquire
	// returned, or (a grant of what the head had collected, made and
	// handed back at once) the head left the queue without its grant. It
	// returns the free units then, avail being those without the n,
	// brought up to date at now by Fill: avail + n when every unit is worth
	// as much as when it was granted; less when the Source cannot hold
	// them all (a bucket keeps at most its burst, and a grant handed back
	// later is worth less by what it accrued meanwhile).
	Return(now, granted time.Time, avail, n, mark int64) int64
}

// A Settler is a Source that can keep its state, and the queue's free
// units, outside the queue's lock while nobody waits: in a word of its own
// that its owner updates lock-free (a rate limiter's one-CAS path for a
// token that is there). The queue decides when the word has the state:
//
//   - Settle is called with the lock held at the end of every operation
//     that leaves the queue open with nobody waiting (and by Init). It
//     reports whether the Settler took the state, with the avail free
//     units, into its word; the queue then keeps 0 free units until Hold.
//     False: the state stays under the lock.
//   - Hold is called with the lock held at the start of every operation
//     after a Settle that took the state, before any other method: it
//     brings the state back under the lock (from then on a fast path
//     outside the lock must refuse to decide) and returns the free units
//     the word had.
//
// So a fast path outside the lock decides only while nobody waits and
// before Close, and never passes a parked caller.
type Settler interface {
	Source
	Settle(avail int64) bool
	Hold() (avail int64)
}

// Config is what an owner tells New about its queue.
type Config struct {
	// Reason names the wait in a sched.DeadlockError, for example
	// "ratelimiter.Acquire".
	Reason string
	// Avail is the number of free units at the start.
	Avail int64
	// Source produces the units over time; nil for none (units then come
	// only from Release). A Settler is offered the state at once.
	Source Source
	// Clock runs the refill alarm; required with a Source.
	Clock loopctx.Clock
	// FailEarly makes Acquire fail at once, with an error matching
	// context.DeadlineExceeded, when the Source says the units cannot be
	// due before ctx's deadline (a rate limiter's rule, as x/time/rate's
	// Wait). Without it a wait lasts until its deadline (a ticker's: a
	// Reset may bring the boundary closer meanwhile).
	FailEarly bool
}

// New returns a queue set up as cfg says.
func New(cfg Config) *Queue {
	q := &Queue{}
	q.Init(cfg)
	return q
}

// Init sets up a zero Queue as New does, for an owner that holds its Queue
// by value (one allocation and one pointer fewer on every call).
func (q *Queue) Init(cfg Config) {
	q.reason, q.avail, q.src, q.failEarly = cfg.Reason, cfg.Avail, cfg.Source, cfg.FailEarly
	q.settle, _ = cfg.Source.(Settler)
	if cfg.Source != nil {
		q.alarm = alarm.New(cfg.Clock, q.refill)
	}
	q.settleLocked()
}

// lock takes the queue's lock and, when a Settler's word has the state,
// brings it back under the lock: every operation that reads or changes the
// state starts here.
func (q *Queue) lock() {
	q.mu.Lock()
	if q.settled {
		q.avail, q.settled = q.settle.Hold(), false
	}
}

// unlock offers a Settler the state back (when nobody waits on an open
// queue) and releases the lock: every operation that started with lock
// ends here.
func (q *Queue) unlock() {
	q.settleLocked()
	q.mu.Unlock()
}

// settleLocked lets a Settler take the state into its own word if nobody
// waits on an open queue. q.mu is held (or q is not shared yet).
func (q *Queue) settleLocked() {
	if q.settle != nil && !q.settled && q.closed == nil && q.queue.Front() == nil && q.settle.Settle(q.avail) {
		q.avail, q.settled = 0, true
	}
}

// A waiter is one parked Acquire. Waiters are pooled: the loopctx.Waiter
// inside is reusable once Wait has returned and makes a new channel for
// every goroutine-mode wait, so a pooled waiter never carries a channel from
// one testing/synctest bubble to another; its cancellation is bound once per
// node, so a parked fiber allocates nothing.
type waiter struct {
	waitq.Links[waiter] // in the queue; guarded by q.mu
	w                   loopctx.Waiter
	q                   *Queue
	n                   int64
	mark                int64     // the Source's mark of the grant
	grantedAt           time.Time // when it was granted (the Source's clock); guarded by q.mu
	err                 error     // set by Close before Wake: the error Acquire returns
	granted             bool      // woken with its n units; guarded by q.mu
}

var waiterPool = sync.Pool{New: func() any {
	wt := &waiter{}
	wt.w = loopctx.NewWaiter(wt.cancel)
	return wt
}}

// now reads the source's clock, if there is a source.
func (q *Queue) now() time.Time {
	if q.src == nil {
		return time.Time{}
	}
	return q.src.Now()
}

// Acquire takes n units, parking the caller (a fiber inside a sched.Run
// loop, else the goroutine) until they are free and every earlier caller
// has been served. It returns the Source's mark of the grant and nil,
// holding all n units, or an error holding none:
//   - ctx.Err() when ctx is done before Acquire returns: a ctx already done
//     fails at once even when units are free, and a grant that raced with
//     the end of ctx is handed back, to the next waiter first, as far as
//     the Source takes it back (Return; a head that leaves hands back what
//     it had collected the same way);
//   - an error matching context.DeadlineExceeded, at once, when the Source
//     says the units cannot be there before ctx's deadline;
//   - the Close error once the queue is closed.
//
// Acquire(ctx, 0) returns at once: ctx.Err(), the Close error, or nil.
func (q *Queue) Acquire(ctx context.Context, n int64) (mark int64, err error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, q.Closed()
	}
	// Why three out-of-line steps and so little here: a fiber parks with
	// this frame and wait's on its stack, for as long as it waits, and what
	// runs below them (a standard context's watch, its allocation, the
	// allocator's slow path) must still fit in the fiber's first stack of
	// 2 KiB. acquireNow and enqueue return before the wait, so their larger
	// frames are never under it. With all three in one frame, nearly every
	// fiber parked under context.WithTimeout would grow its stack to 4 KiB
	// (see TestParkedFiberStack in ratelimiter).
	now, mark, done, err := q.acquireNow(ctx, n)
	if done {
		return mark, err
	}
	wt, mark, err := q.enqueue(ctx, n, now)
	if wt == nil {
		return mark, err
	}
	return q.wait(ctx, wt)
}

// acquireNow is Acquire's first step: take n units if they are free and
// nobody waits, or fail at once (closed, or the deadline cannot be met).
// done reports that Acquire returns mark and err without parking.
//
//go:noinline
func (q *Queue) acquireNow(ctx context.Context, n int64) (now time.Time, mark int64, done bool, err error) {
	now = q.now()
	q.lock()
	if mark, ok, err := q.tryLocked(now, n); ok || err != nil {
		q.unlock()
		return now, mark, true, err
	}
	if err := q.checkDeadline(ctx, now, n); err != nil {
		q.unlock()
		return now, 0, true, err
	}
	q.unlock()
	return now, 0, false, nil
}

// enqueue binds a pooled waiter to the caller and publishes it: the
// two-phase park, then a look again, since units may have come meanwhile.
// It returns the queued waiter, or nil and Acquire's result when the look
// again decided.
//
//go:noinline
func (q *Queue) enqueue(ctx context.Context, n int64, now time.Time) (wt *waiter, mark int64, err error) {
	wt = waiterPool.Get().(*waiter)
	wt.q, wt.n, wt.mark, wt.err, wt.granted = q, n, 0, nil, false
	wt.w.Prepare(ctx, q.reason, n)
	q.lock()
	if mark, ok, err := q.tryLocked(now, n); ok || err != nil {
		q.unlock()
		wt.q = nil
		waiterPool.Put(wt)
		return nil, mark, err
	}
	q.queue.Push(wt)
	if q.queue.Front() == wt {
		q.serveLocked(now) // a Source may give the new head units at once
	}
	q.unlock()
	// A standard context makes its Done channel on first use; made here,
	// the allocation runs before the wait, not deep inside it.
	ctx.Done()
	return wt, 0, nil
}

// wait parks on wt, queued, and returns Acquire's result. When a run loop
// stops the parked fiber instead of resuming it (sched.Run ending while the
// fiber still waits: a deadlock, a panic in another fiber, a daemon that
// ignored its cancellation), a wait still pending ends through OnCancel,
// but a grant made just before the stop was never seen by the caller;
// abandon takes the waiter out of the queue if it is still there (a head
// leaves its collection, as on cancel) and gives such a grant back, so
// nothing is lost that the Source keeps.
//
//go:noinline
func (q *Queue) wait(ctx context.Context, wt *waiter) (mark int64, err error) {
	returned := false
	defer func() {
		if !returned {
			q.abandon(wt)
		}
	}()
	err = wt.w.Wait(ctx)
	returned = true
	mark = wt.mark
	if err == nil {
		err = wt.err // nil for a grant, the Close error otherwise
	}
	if err == nil && ctx.Err() != nil {
		// Granted, but ctx ended before Acquire returned: the done ctx
		// wins (a select between "acquired" and "cancelled" must not
		// depend on timing), and the grant passes on.
		q.handBack(wt)
		err = ctx.Err()
	}
	wt.q, wt.err = nil, nil
	waiterPool.Put(wt)
	if err != nil {
		return 0, err
	}
	return mark, nil
}

// tryLocked takes n units if nobody waits and they are free. It returns an
// error when Acquire must fail at once. q.mu is held.
func (q *Queue) tryLocked(now time.Time, n int64) (mark int64, ok bool, err error) {
	switch {
	case q.closed != nil:
		return 0, false, q.closed
	case q.queue.Front() != nil:
		return 0, false, nil
	}
	if q.src != nil {
		q.avail = q.src.Fill(now, q.avail, n, false)
	}
	if q.avail < n {
		return 0, false, nil
	}
	q.avail -= n
	if q.src != nil {
		mark = q.src.Take(n)
	}
	return mark, true, nil
}

// checkDeadline fails a wait that cannot end before ctx's deadline even if
// every caller ahead gave up. q.mu is held.
func (q *Queue) checkDeadline(ctx context.Context, now time.Time, n int64) error {
	if !q.failEarly || q.avail >= n {
		return nil
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		return nil
	}
	at, due := q.src.Due(now, q.avail, n)
	d := max(at.Sub(now), 0)
	// Strictly before: at the deadline instant itself the ctx has ended.
	if due && now.Add(d).Before(deadline) {
		return nil
	}
	if !due {
		d = -1
	}
	return q.deadlineError(n, d, deadline.Sub(now))
}

// deadlineError is checkDeadline's error, built out of line: formatting
// needs a large frame, and a frame on the path of every wait with a
// deadline would make each parked fiber's stack grow past its first size
// (a fiber parks with that stack for as long as it waits).
//
//go:noinline
func (q *Queue) deadlineError(n int64, d, left time.Duration) error {
	if d < 0 {
		return fmt.Errorf("%s n=%d: the units will never be there: %w", q.reason, n, context.DeadlineExceeded)
	}
	return fmt.Errorf("%s n=%d: would wait %v, past ctx's deadline in %v: %w",
		q.reason, n, d, left, context.DeadlineExceeded)
}

// TryAcquire takes n units without blocking and reports whether it did,
// with the Source's mark of the grant. It fails while any Acquire is parked,
// even if n units are free (no barging), and once the queue is closed.
func (q *Queue) TryAcquire(n int64) (mark int64, ok bool) {
	if q.src != nil {
		return q.trySource(n)
	}
	// The free units are all there is: no clock to read, nothing to fill
	// or settle. Why a path of its own, and the Source's in a function of
	// its own: it is a semaphore's every uncontended Acquire and
	// TryAcquire, and a small frame is 2–3% of an Acquire and Release pair
	// (BenchmarkAcquireSeq in bench/, impl=sluice).
	q.mu.Lock()
	ok = q.closed == nil && q.queue.Len() == 0 && q.avail >= n
	if ok {
		q.avail -= n
	}
	q.mu.Unlock()
	return 0, ok
}

// trySource is TryAcquire on a queue with a Source.
func (q *Queue) trySource(n int64) (mark int64, ok bool) {
	now := q.src.Now()
	q.lock()
	mark, ok, err := q.tryLocked(now, n)
	q.unlock()
	return mark, ok && err == nil
}

// Release adds n free units, unless that would take them past max (a
// semaphore's size; math.MaxInt64 for no bound), and hands them to the
// waiters at the head of the queue, in order, as far as they go. When n
// would take the free units past max it adds nothing and returns false
// with the units held (max less the free ones).
func (q *Queue) Release(n, max int64) (held int64, ok bool) {
	if q.settle != nil { // set by New only: read without the lock
		return q.releaseHeld(n, max)
	}
	// No Settler (a semaphore's queue): the lock alone. Why a path of its
	// own: it is a semaphore's every Release, and lock and unlock are too
	// big to inline; their calls cost 5–7% of an Acquire and Release pair
	// (BenchmarkAcquireSeq in bench/, impl=sluice).
	now := q.now()
	q.mu.Lock()
	if q.avail+n > max || q.avail+n < q.avail {
		held = max - q.avail
		q.mu.Unlock()
		return held, false
	}
	q.avail += n
	if q.queue.Len() > 0 {
		q.serveLocked(now)
	}
	q.mu.Unlock()
	return 0, true
}

// releaseHeld is Release on a queue with a Settler.
func (q *Queue) releaseHeld(n, max int64) (held int64, ok bool) {
	now := q.now()
	q.lock()
	if q.avail+n > max || q.avail+n < q.avail {
		held = max - q.avail
		q.unlock()
		return held, false
	}
	q.avail += n
	if q.queue.Len() > 0 {
		q.serveLocked(now)
	}
	q.unlock()
	return 0, true
}

// refill asks the Source for what it has produced, serves the waiters it
// covers, and re-arms the alarm for the new head. The alarm calls it.
func (q *Queue) refill() {
	now := q.now()
	q.lock()
	if q.closed == nil {
		// No Do(nil): its State would escape to the heap, and a refill is
		// on every parked caller's path.
		q.avail = q.src.Fill(now, q.avail, 0, q.queue.Len() > 0)
		q.serveLocked(now)
	}
	q.unlock()
}

// Do runs f with the queue's lock held, on the queue's state with the free
// units brought up to date, and keeps the units f leaves in s.Avail; then
// it serves the queue and re-arms the alarm for the head. It is
// how an owner reads or changes its Source's state (a rate, a burst, a
// grid) so that parked callers are re-timed at once. On a closed queue f
// still runs, on the units as they were, and nothing is served.
func (q *Queue) Do(f func(s *State)) {
	now := q.now()
	q.lock()
	defer q.unlock()
	st := State{Now: now, Avail: q.avail, Waiting: q.queue.Len() > 0, Closed: q.closed != nil}
	if !st.Closed && q.src != nil {
		st.Avail = q.src.Fill(now, st.Avail, 0, st.Waiting)
	}
	f(&st)
	q.avail = st.Avail
	q.serveLocked(now)
}

// State is what Do shows its func.
type State struct {
	Now     time.Time // the Source's clock, read before the lock
	Avail   int64     // free units; f may change them
	Waiting bool      // someone is parked
	Closed  bool      // Close has been called
}

// serveLocked grants units to the waiters from the head while the head's
// request is covered, then arms the alarm for the instant the new head's
// units are due, or clears it when nobody waits.
// Strict FIFO: a large request at the head blocks smaller ones behind it,
// so a steady trickle of small requests can never starve a large one.
// q.mu is held.
func (q *Queue) serveLocked(now time.Time) {
	if q.closed != nil {
		return
	}
	for wt := q.queue.Front(); wt != nil; wt = q.queue.Front() {
		if q.src != nil {
			q.avail = q.src.Fill(now, q.avail, wt.n, true)
		}
		if q.avail < wt.n {
			break
		}
		q.queue.Remove(wt)
		q.avail -= wt.n
		if q.src != nil {
			wt.mark = q.src.Take(wt.n)
		}
		wt.granted, wt.grantedAt = true, now
		if !wt.w.Wake() {
			// Its cancellation won the race and its OnCancel is on the way
			// (it will find the waiter out of the queue): the units were
			// never handed over, so they come back for the next, as far as
			// the Source takes them back.
			wt.granted = false
			q.giveBack(now, wt)
		}
	}
	if q.src == nil {
		return
	}
	if head := q.queue.Front(); head != nil {
		// The loop above stopped at it: head.n > q.avail.
		at, _ := q.src.Due(now, q.avail, head.n)
		q.alarm.Set(now, at)
	} else {
		// Nobody waits: let the Source cap what it keeps (a bucket holds
		// at most its burst).
		q.avail = q.src.Fill(now, q.avail, 0, false)
		q.alarm.Clear()
	}
}

// giveBack returns a grant's units to the free count, as far as the Source
// takes them back. q.mu is held.
func (q *Queue) giveBack(now time.Time, wt *waiter) {
	if q.src == nil {
		q.avail += wt.n
		return
	}
	q.avail = q.src.Fill(now, q.avail, 0, q.queue.Len() > 0)
	q.avail = q.src.Return(now, wt.grantedAt, q.avail, wt.n, wt.mark)
}

// leaveLocked is called when the head leaves the queue without its grant
// (its ctx ended, its fiber was stopped, or the queue closed): every free
// unit is one it had collected. They come back as a grant of them, made
// and handed back at now, so that the Source decides what they are worth
// as it does for any hand-back.
//
// Why not leave them free for the next waiter as they are: a head may
// collect more than a Source can hold (a bucket's head of n > burst holds
// up to n − 1 tokens), and handing all of that on at once would grant the
// callers behind it more than the Source allows in that instant. q.mu is
// held.
func (q *Queue) leaveLocked(now time.Time) {
	if q.src == nil {
		return
	}
	q.avail = q.src.Fill(now, q.avail, 0, true) // its collection, up to now
	if q.avail > 0 {
		mark := q.src.Take(q.avail)
		q.avail = q.src.Return(now, now, 0, q.avail, mark)
	}
}

// handBack gives back the grant of a caller whose ctx ended before Acquire
// returned.
func (q *Queue) handBack(wt *waiter) {
	now := q.now()
	q.lock()
	wt.granted = false
	q.giveBack(now, wt)
	q.serveLocked(now)
	q.unlock()
}

// abandon undoes a wait whose fiber was stopped mid-wait. The waiter is not
// reused.
func (q *Queue) abandon(wt *waiter) {
	now := q.now()
	q.lock()
	defer q.unlock()
	switch {
	case wt.Queued():
		wasHead := q.queue.Front() == wt
		q.queue.Remove(wt)
		if wasHead {
			q.leaveLocked(now)
		}
	case wt.granted:
		wt.granted = false
		q.giveBack(now, wt)
	}
	q.serveLocked(now)
}

// cancel is every waiter's OnCancel: it runs when the caller's context wins
// over a grant, before the caller resumes, and takes the waiter out of the
// queue. Its leaving may let the waiters behind it go: a head leaves what
// it had collected (see leaveLocked).
func (wt *waiter) cancel() {
	q := wt.q
	now := q.now()
	q.lock()
	if wt.Queued() {
		wasHead := q.queue.Front() == wt
		q.queue.Remove(wt)
		if wasHead {
			q.leaveLocked(now)
			q.serveLocked(now)
		}
	}
	q.unlock()
}

// Close fails every parked Acquire and every later one with err, clears the
// alarm, and reports whether it was the first Close (only the
// first has an effect). Units keep their accounting: Release still works.
func (q *Queue) Close(err error) bool {
	now := q.now()
	q.lock()
	defer q.unlock()
	if q.closed != nil {
		return false
	}
	if q.settle != nil && q.queue.Front() == nil {
		// The Settler's state comes under the lock for good, up to date:
		// the units the queue keeps are those of the Close instant.
		q.avail = q.src.Fill(now, q.avail, 0, false)
	}
	if q.queue.Front() != nil {
		q.leaveLocked(now) // the head leaves with the rest, its collection as any leaver's
	}
	q.closed = err
	for wt := q.queue.Front(); wt != nil; wt = q.queue.Front() {
		q.queue.Remove(wt)
		wt.err = err
		wt.w.Wake() // false: it was cancelled meanwhile and returns ctx.Err()
	}
	if q.alarm != nil {
		q.alarm.Clear()
	}
	return true
}

// Closed returns the Close error, or nil while the queue is open.
func (q *Queue) Closed() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closed
}

// Available returns the number of free units, as last brought up to date.
// Units may be free while callers wait: the head needs more than are free.
// With a Settler Source it counts only the units the queue holds (0 while
// the Settler's word has them).
func (q *Queue) Available() int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.avail
}

// Waiters returns the number of parked Acquire calls.
func (q *Queue) Waiters() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.queue.Len()
}
