package sched

import (
	"context"
	"sync/atomic"
)

// When no fiber can run, the loop looks for wakes that may still come from
// outside it (a Blocking call in flight, a timer another goroutine fires, a
// context on its way to its end, an AfterFunc callback not returned yet)
// before it lets virtual time move or reports a deadlock.

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
