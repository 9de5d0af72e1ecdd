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
	base := tat
	if base < now {
		base = now // a bucket cannot hold more than full: idle time beyond full is forgotten
	}
	next := base + cost*T
	if next-now <= tau {
		r.Allowed = true
		r.Remaining = float64(tau-(next-now)) / float64(T)
		r.ResetAfter = time.Duration(next - now)
		return next, r
	}
	r.RetryAfter = time.Duration(next - tau - now)
	r.Remaining = float64(tau-(base-now)) / float64(T)
	r.ResetAfter = time.Duration(base - now)
	return tat, r
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
