// Package semaphore provides a weighted semaphore with strict FIFO order and
// direct hand-off, usable from sched fibers and plain goroutines alike.
//
// Acquire takes a context.Context first. Inside a sched.Run loop it parks the
// calling fiber (other fibers run meanwhile, and a timeout on the loop's
// clock, virtual or real, ends the wait at its exact instant); outside any
// loop it blocks the calling goroutine. The two kinds of caller may share one
// Semaphore.
package semaphore

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/sluice-go/sluice/internal/waitq"
	"github.com/sluice-go/sluice/sched"
)

var (
	// ErrClosed is what waiters and later Acquire calls get from a
	// Semaphore closed with Close(nil).
	ErrClosed = errors.New("semaphore: closed")
	// ErrExceedsSize is wrapped by the error Acquire returns at once for a
	// request larger than the semaphore: no amount of waiting could grant it.
	ErrExceedsSize = errors.New("semaphore: request exceeds the semaphore's size")
)

// A Semaphore hands out up to size permits. Waiters are served in strict
// FIFO order with direct hand-off: a Release grants permits to the waiter at
// the head of the queue, under the same lock, before anyone else can take
// them, and nobody barges past a parked waiter (TryAcquire fails while anyone
// waits, even when enough permits are free). Acquire is atomic for its
// caller: it returns holding all n permits or holding none.
//
// A Semaphore is safe for use by many goroutines and fibers at once. The
// zero value is not usable: call New.
type Semaphore struct {
	size int64

	mu     sync.Mutex                   // guards the fields below
	avail  int64                        // free permits; size − avail are held
	queue  waitq.Queue[waiter, *waiter] // FIFO of parked callers
	closed error                        // set once by Close; nil while open
}

// A waiter is one parked Acquire. Waiters are pooled: the sched.Waiter inside
// is reusable once Wait has returned, and OnCancel is bound once per node, so
// a parked Acquire allocates nothing in steady state.
type waiter struct {
	waitq.Links[waiter] // in the queue; guarded by the owner's mu
	w                   sched.Waiter
	s                   *Semaphore
	n                   int64
	err                 error // set by Close before Wake: the error Acquire returns
	granted             bool  // woken with its n permits; guarded by s.mu
}

var waiterPool = sync.Pool{New: func() any {
	wt := &waiter{}
	wt.w.Reason = "semaphore.Acquire"
	wt.w.OnCancel = wt.cancel
	return wt
}}

// New returns a semaphore of size n with all n permits free. It panics if n
// is negative.
func New(n int64) *Semaphore {
	if n < 0 {
		panic(fmt.Sprintf("semaphore: New(%d): negative size", n))
	}
	return &Semaphore{size: n, avail: n}
}

// Acquire takes n permits, blocking (inside a loop: parking the fiber) until
// they are free and every earlier waiter has been served. It returns nil
// holding all n, or an error holding none:
//   - ctx.Err() when ctx ends first (a ctx already done fails at once, even
//     if the permits are free);
//   - the Close error once the semaphore is closed;
//   - an error wrapping ErrExceedsSize, at once, when n exceeds the size.
//
// When a grant and a cancellation race, exactly one wins: either Acquire
// returns nil and the caller holds n, or it returns ctx.Err() and the
// permits went to the next waiter. Acquire(ctx, 0) returns nil at once unless
// ctx is done or the semaphore is closed. It panics if n is negative.
func (s *Semaphore) Acquire(ctx context.Context, n int64) error {
	if n < 0 {
		panic(fmt.Sprintf("semaphore: Acquire with negative n=%d", n))
	}
	// A done context wins even when permits are free: the caller may have
	// stopped caring, and a select between "acquired" and "cancelled" must
	// not depend on timing.
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	if ok, err := s.tryLocked(n); ok || err != nil {
		s.mu.Unlock()
		return err
	}
	s.mu.Unlock()

	// Slow path: bind a pooled waiter to the caller before publishing it,
	// then look again, since the state may have changed meanwhile.
	wt := waiterPool.Get().(*waiter)
	wt.s, wt.n, wt.err, wt.granted = s, n, nil, false
	wt.w.N = n
	wt.w.Prepare(ctx)
	s.mu.Lock()
	if ok, err := s.tryLocked(n); ok || err != nil {
		s.mu.Unlock()
		wt.s = nil
		waiterPool.Put(wt)
		return err
	}
	s.queue.Push(wt)
	s.mu.Unlock()

	err := s.wait(ctx, wt)
	if err == nil {
		err = wt.err // nil for a grant, the Close error otherwise
	}
	wt.s, wt.err = nil, nil
	waiterPool.Put(wt)
	return err
}

// wait parks on wt. When a run loop stops the parked fiber instead of
// resuming it (sched.Run ending while the fiber still waits: a deadlock, a
// panic in another fiber, a daemon that ignored its cancellation), a wait
// still pending ends through OnCancel, but a grant made just before the
// stop was never seen by the caller; abandon takes the waiter out of the
// queue if it is still there and gives such a grant back, so nothing is lost.
func (s *Semaphore) wait(ctx context.Context, wt *waiter) error {
	returned := false
	defer func() {
		if !returned {
			s.abandon(wt)
		}
	}()
	err := wt.w.Wait(ctx)
	returned = true
	return err
}

// abandon undoes a wait whose fiber was stopped mid-wait. The waiter is not
// reused.
func (s *Semaphore) abandon(wt *waiter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case wt.Queued():
		wasHead := s.queue.Front() == wt
		s.queue.Remove(wt)
		if wasHead {
			s.grantLocked()
		}
	case wt.granted:
		s.avail += wt.n
		s.grantLocked()
	}
}

// tryLocked takes n permits if nobody waits and they are free. It returns an
// error when the Acquire must fail at once. s.mu is held.
func (s *Semaphore) tryLocked(n int64) (bool, error) {
	switch {
	case s.closed != nil:
		return false, s.closed
	case n > s.size:
		return false, fmt.Errorf("%w: Acquire(n=%d) on a semaphore of size %d", ErrExceedsSize, n, s.size)
	case s.queue.Front() == nil && s.avail >= n:
		s.avail -= n
		return true, nil
	}
	return false, nil
}

// TryAcquire takes n permits without blocking and reports whether it did.
// It fails while any Acquire is parked, even if n permits are free (no
// barging), and after Close. It panics if n is negative.
func (s *Semaphore) TryAcquire(n int64) bool {
	if n < 0 {
		panic(fmt.Sprintf("semaphore: TryAcquire with negative n=%d", n))
	}
	s.mu.Lock()
	ok := s.closed == nil && s.queue.Front() == nil && s.avail >= n
	if ok {
		s.avail -= n
	}
	s.mu.Unlock()
	return ok
}

// Release returns n permits and hands them to the waiters at the head of the
// queue, in order, as far as they go. It panics if n is negative or if more
// permits would be free than the semaphore's size (a release of permits that
// were never acquired). Releasing after Close is allowed.
func (s *Semaphore) Release(n int64) {
	if n < 0 {
		panic(fmt.Sprintf("semaphore: Release with negative n=%d", n))
	}
	s.mu.Lock()
	if s.avail+n > s.size || s.avail+n < s.avail {
		held := s.size - s.avail
		s.mu.Unlock()
		panic(fmt.Sprintf("semaphore: Release(%d) with only %d permits held", n, held))
	}
	s.avail += n
	s.grantLocked()
	s.mu.Unlock()
}

// grantLocked serves the queue from its head while the head's request fits.
// Strict FIFO: a large request at the head blocks smaller ones behind it, so
// a steady trickle of small requests can never starve a large one. s.mu is
// held.
func (s *Semaphore) grantLocked() {
	for wt := s.queue.Front(); wt != nil && s.avail >= wt.n; wt = s.queue.Front() {
		s.queue.Remove(wt)
		s.avail -= wt.n
		wt.granted = true
		if !wt.w.Wake() {
			wt.granted = false
			// Its cancellation won the race and its OnCancel is on the way
			// (it will find the waiter already out of the queue): the
			// permits were never granted, so they stay here for the next.
			s.avail += wt.n
		}
	}
}

// cancel is every waiter's OnCancel: it runs when the caller's context wins
// over a grant, before the caller resumes, and takes the waiter out of the
// queue. Its leaving may let the waiters behind it go.
func (wt *waiter) cancel() {
	s := wt.s
	s.mu.Lock()
	if wt.Queued() {
		wasHead := s.queue.Front() == wt
		s.queue.Remove(wt)
		if wasHead {
			s.grantLocked()
		}
	}
	s.mu.Unlock()
}

// Close fails every parked Acquire and every later one with err (ErrClosed
// when err is nil). Permits keep their accounting: holders may still Release.
// Only the first Close has an effect.
func (s *Semaphore) Close(err error) {
	if err == nil {
		err = ErrClosed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed != nil {
		return
	}
	s.closed = err
	for wt := s.queue.Front(); wt != nil; wt = s.queue.Front() {
		s.queue.Remove(wt)
		wt.err = err
		wt.w.Wake() // false: it was cancelled meanwhile and returns ctx.Err()
	}
}

// Available returns the number of free permits. Permits may be free while
// Acquire calls wait: the head waiter needs more than are free.
func (s *Semaphore) Available() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.avail
}

// Waiters returns the number of parked Acquire calls.
func (s *Semaphore) Waiters() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queue.Len()
}

// Size returns the semaphore's size, as given to New.
func (s *Semaphore) Size() int64 { return s.size }
