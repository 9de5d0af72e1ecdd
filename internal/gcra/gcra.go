// Package gcra is the one GCRA step of the library: the memory store
// (package store), the shared table (package sharedbucket) and the rate
// limiter's lock-free path (package ratelimiter, in its own time unit) call
// it on their hot paths, the Redis store's script follows it step for step,
// and internal/gcratest holds the cases every one of them passes.
//
// A bucket is one int64, its theoretical arrival time (TAT), in nanoseconds
// of some clock. With emission interval T (ns per token) and tolerance
// tau = burst·T, a request of cost tokens (need = cost·T ns) at now is
// allowed iff
//
//	max(tat, now) + need − now ≤ tau,
//
// and the TAT then becomes max(tat, now) + need; a denial changes nothing.
// The functions work on the bucket's debt, max(tat − now, 0): how long
// until it is full again.
//
// Every function here is small enough to inline: sharedbucket calls Step
// between loading a TAT and swapping it, where every instruction widens the
// window in which another core can take the slot's cache line.
package gcra

import "time"

// Debt is how far tat lies ahead of now in nanoseconds: 0 when tat ≤ now (a
// full bucket; idle time beyond full is forgotten).
//
// Why compare first instead of max(tat, now) − now: for now ≥ 0, tat − now
// is then computed only when it is positive, so it cannot overflow whatever
// tat holds (a damaged shared word included).
func Debt(tat, now int64) int64 {
	if tat > now {
		return tat - now
	}
	return 0
}

// Step decides a request needing need = cost·T nanoseconds, at now, on a
// bucket whose TAT is tat, where room = tau − need is the most debt the
// bucket may carry for the request to fit. It returns whether the request
// is allowed and next: the TAT to store when allowed, max(tat, now) + need,
// and max(tat, now) when denied (nothing needs writing then: a denial
// changes nothing). Either way next − now is the bucket's debt after the
// decision.
//
// Why room and not tau: callers that update the TAT with a compare-and-swap
// compute need and room once, before they load the TAT (and outside any
// retry loop), so the window between the load and the swap holds only
// Step's compare and add.
//
// Why the test is next − now > room rather than
// max(tat, now) + need − now > tau: callers guarantee 0 < need ≤ tau and
// now ≥ 0, so neither side can overflow, whatever tat holds (a damaged
// shared word included). An allowed step's sum stays at most now + tau.
func Step(tat, now, need, room int64) (next int64, ok bool) {
	next = max(tat, now) // a bucket holds no more than full: idle time beyond full is forgotten
	if next-now > room {
		return next, false
	}
	return next + need, true
}

// Result is a decision with its figures, in the shape of store.Result and
// sharedbucket.Decision (each converts to both).
type Result struct {
	Allowed    bool
	Remaining  float64 // tokens left after the decision: (tau − debt)/T
	RetryAfter time.Duration
	ResetAfter time.Duration // the debt after the decision
}

// Figures is the Result of a decision: ok and the debt after it as Step
// returned them, for a request needing need under interval T and tolerance
// tau. RetryAfter is 0 when allowed, else how long until the same request
// fits if nobody else spends: debt + need − tau (never negative).
//
// Why apart from Step: a caller that swaps the TAT with a compare-and-swap
// keeps the window between its load and its swap to Step's few integer
// instructions and builds the figures, with their float division, after.
func Figures(ok bool, debt, need, T, tau int64) Result {
	r := Result{Allowed: ok, Remaining: float64(tau-debt) / float64(T), ResetAfter: time.Duration(debt)}
	if !ok {
		r.RetryAfter = time.Duration(max(debt+need-tau, 0))
	}
	return r
}
