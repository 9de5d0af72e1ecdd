package store

import (
	"fmt"
	"time"
)

// Decide applies GCRA to one key whose theoretical arrival time is tat, at
// time now (both in nanoseconds on the same clock; a key never seen has
// tat ≤ now), for a request of cost tokens with emission interval T and
// tolerance tau = burst·T. It returns the TAT to store and the decision. A
// denial returns tat unchanged: nothing needs writing.
//
// The rule: allowed iff max(tat, now) + cost·T − now ≤ tau. Every store uses
// this function (the Redis store runs the same steps in Lua), so all of them
// admit at most burst + (e−s)/T tokens over any window [s, e].
//
// Callers guarantee 1 ≤ cost and cost·T ≤ tau.
func Decide(tat, now, cost, T, tau int64) (newTAT int64, r Result) {
	base, next, ok := admit(tat, now, cost, T, tau)
	r = result(ok, base, next, now, T, tau)
	if !ok {
		return tat, r
	}
	return next, r
}

// admit is Decide's rule alone, in integers: base = max(tat, now), the TAT an
// allowed request moves to (next), and whether it is allowed. Why apart from
// result: a store that updates the TAT with a compare-and-swap keeps the
// window between reading the TAT and swapping it to these few instructions,
// and builds the Result (with its float division) after the swap.
func admit(tat, now, cost, T, tau int64) (base, next int64, ok bool) {
	base = max(tat, now) // a bucket cannot hold more than full: idle time beyond full is forgotten
	next = base + cost*T
	return base, next, next-now <= tau
}

// result is the Result of an admit that returned base, next and ok.
func result(ok bool, base, next, now, T, tau int64) (r Result) {
	if ok {
		r.Allowed = true
		r.Remaining = float64(tau-(next-now)) / float64(T)
		r.ResetAfter = time.Duration(next - now)
		return r
	}
	r.RetryAfter = time.Duration(next - tau - now)
	r.Remaining = float64(tau-(base-now)) / float64(T)
	r.ResetAfter = time.Duration(base - now)
	return r
}

// Check validates the cost every store's Allow receives: it returns
// ErrCostExceedsBurst when cost > p.Burst and an error naming cost when it is
// below 1.
func Check(cost int64, p Policy) error {
	if cost < 1 {
		return fmt.Errorf("store: cost %d must be at least 1", cost)
	}
	if cost > p.Burst {
		return ErrCostExceedsBurst
	}
	return nil
}
