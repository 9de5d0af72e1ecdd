// Package vwake lets sched arm a virtual timer that wakes a waiter itself:
// a vclock.Timer kept inside the waiting fiber's own memory, whose fire
// calls the waiter's Wake with no callback in between. Why: with 100k
// fibers asleep every wake finds its timer, its callback and its waiter out
// of cache; one object instead of three is one cache miss instead of three.
// Internal, so that vclock's public API stays AfterFunc and Timer.
//
// Watch, too, is sched's alone: a run loop's look at timers that another
// goroutine is firing.
package vwake

import "sync/atomic"

// A Waker is what a bound timer calls when it fires (sched's *waiter).
type Waker interface{ Wake() bool }

// Bind makes t, a zero *vclock.Timer, a timer of c (a *vclock.Clock) whose
// fire calls w.Wake; t.Reset then arms it, t.Stop disarms it, as any timer
// of c. Set by vclock's init; the types are any because this package cannot
// name vclock's (vclock imports it), and a bind happens once per fiber, not
// per wait.
var Bind func(t, c any, w Waker)

// Watch returns c's count (c a *vclock.Clock) of fires in flight: timers
// taken off c's queue, by whatever goroutine advances c, whose callback or
// Wake has not returned yet. The count rises under c's lock as the timer
// is taken, so whoever finds the queue without that timer then sees it
// raised; it drops once the callback or Wake has returned, so a wake the
// fire delivers is delivered before it drops. Watch also makes ended run,
// on the firing goroutine, each time the count drops to zero, for fires
// taken from now on (nil: nothing runs); a run loop uses it to wake itself
// when it waits for such a fire. One watcher per clock: a later Watch
// replaces it. Set by vclock's init.
var Watch func(c any, ended func()) *atomic.Int32
