// Package semaphore provides a weighted semaphore with strict FIFO order and
// direct hand-off, usable from sched fibers and plain goroutines alike.
//
//	sem := semaphore.New(4) // at most 4 uploads at once
//	if err := sem.Acquire(ctx, 1); err != nil {
//		return err // ctx ended first, or the semaphore was closed: nothing is held
//	}
//	defer sem.Release(1)
//
// Acquire takes a context.Context first, and the context chooses how the
// caller waits and which clock ends the wait:
//   - inside a sched.Run loop it parks the calling fiber (other fibers run
//     meanwhile) and a timeout on the loop's clock, virtual or real, ends the
//     wait at its exact instant;
//   - outside any loop it blocks the calling goroutine, and the ctx's own
//     deadline (real time) ends it;
//   - inside a testing/synctest bubble that is the bubble's fake time: a
//     Semaphore works in any number of bubbles, and before and after them.
//
// A Semaphore has no clock of its own (nothing to set with a clock.Mock):
// time enters only through ctx.
//
// The two kinds of caller may share one Semaphore. A ctx that is done
// before Acquire returns always wins: Acquire returns ctx.Err() holding
// nothing, and the permits pass on.
//
// A Semaphore is the FIFO parking core that ticker.Ticker and
// ratelimiter.Limiter share, with permits as its units: no clock makes
// them, Release gives them back.
package semaphore

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluice-go/sluice/internal/queue"
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
	q    queue.Queue // its units are the free permits; no Source: only Release adds them
}

// New returns a semaphore of size n with all n permits free. It panics if n
// is negative.
func New(n int64) *Semaphore {
	if n < 0 {
		panic(fmt.Sprintf("semaphore: New(%d): negative size", n))
	}
	s := &Semaphore{size: n}
	s.q.Init(queue.Config{Reason: "semaphore.Acquire", Avail: n})
	return s
}

// Acquire takes n permits, blocking (inside a loop: parking the fiber) until
// they are free and every earlier waiter has been served. It returns nil
// holding all n, or an error holding none:
//   - ctx.Err() when ctx is done before Acquire returns (a ctx already done
//     fails at once, even if the permits are free);
//   - the Close error once the semaphore is closed;
//   - an error wrapping ErrExceedsSize, at once, when n exceeds the size.
//
// When a grant and a cancellation race, the cancellation wins if ctx was
// done before Acquire returned: Acquire returns ctx.Err() and the permits
// go to the next waiter. Acquire(ctx, 0) returns nil at once unless ctx is
// done or the semaphore is closed. It panics if n is negative.
func (s *Semaphore) Acquire(ctx context.Context, n int64) error {
	if n < 0 {
		panic(fmt.Sprintf("semaphore: Acquire with negative n=%d", n))
	}
	if n > s.size {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := s.q.Closed(); err != nil {
			return err
		}
		return fmt.Errorf("%w: Acquire(n=%d) on a semaphore of size %d", ErrExceedsSize, n, s.size)
	}
	// Permits free and nobody waiting: taken without the parking path's
	// larger call (Acquire repeats this check before it parks).
	if ctx.Err() == nil {
		if _, ok := s.q.TryAcquire(n); ok {
			return nil
		}
	}
	_, err := s.q.Acquire(ctx, n)
	return err
}

// TryAcquire takes n permits without blocking and reports whether it did.
// It fails while any Acquire is parked, even if n permits are free (no
// barging), and after Close. It panics if n is negative.
func (s *Semaphore) TryAcquire(n int64) bool {
	if n < 0 {
		panic(fmt.Sprintf("semaphore: TryAcquire with negative n=%d", n))
	}
	_, ok := s.q.TryAcquire(n)
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
	if held, ok := s.q.Release(n, s.size); !ok {
		panic(fmt.Sprintf("semaphore: Release(%d) with only %d permits held", n, held))
	}
}

// Close fails every parked Acquire and every later one with err (ErrClosed
// when err is nil). Permits keep their accounting: holders may still Release.
// Only the first Close has an effect.
func (s *Semaphore) Close(err error) {
	if err == nil {
		err = ErrClosed
	}
	s.q.Close(err)
}

// Available returns the number of free permits. Permits may be free while
// Acquire calls wait: the head waiter needs more than are free.
func (s *Semaphore) Available() int64 { return s.q.Available() }

// Waiters returns the number of parked Acquire calls.
func (s *Semaphore) Waiters() int { return s.q.Waiters() }

// Size returns the semaphore's size, as given to New.
func (s *Semaphore) Size() int64 { return s.size }
