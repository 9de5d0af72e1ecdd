// Package vwake lets sched arm a virtual timer that wakes a waiter itself:
// a vclock.Timer kept inside the waiting fiber's own memory, whose fire
// calls the waiter's Wake with no callback in between. Why: with 100k
// fibers asleep every wake finds its timer, its callback and its waiter out
// of cache; one object instead of three is one cache miss instead of three.
// Internal, so that vclock's public API stays AfterFunc and Timer.
package vwake

// A Waker is what a bound timer calls when it fires (sched's *Waiter).
type Waker interface{ Wake() bool }

// Bind makes t, a zero *vclock.Timer, a timer of c (a *vclock.Clock) whose
// fire calls w.Wake; t.Reset then arms it, t.Stop disarms it, as any timer
// of c. Set by vclock's init; the types are any because this package cannot
// name vclock's (vclock imports it), and a bind happens once per fiber, not
// per wait.
var Bind func(t, c any, w Waker)
