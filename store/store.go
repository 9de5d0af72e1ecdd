// Package store defines where the rate-limit service keeps its buckets.
//
//	s := store.NewMemory() // forgets idle keys by itself; at most DefaultMaxKeys
//	r, err := s.Allow(ctx, "tenant-a", 1, store.Policy{Rate: 100, Burst: 200})
//	if err == nil && !r.Allowed {
//		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(r.RetryAfter.Seconds()))))
//	}
//
// A Store answers one question per request: may key spend cost tokens under
// policy p now? Every implementation (the in-process Memory store, the shared-
// memory store over package sharedbucket, and the Redis store) applies the
// same GCRA rule, with T = Policy.Interval and τ = Policy.Tolerance: a
// request of cost tokens at now, on a key whose theoretical arrival time is
// tat, is allowed iff
//
//	max(tat, now) + cost·T − now ≤ τ,
//
// and then the key's TAT becomes max(tat, now) + cost·T; a denial changes
// nothing. The Go stores share one implementation of that step and the Redis
// store's script follows it, all held to one table of cases, so the stores
// differ only in where the one int64 per key lives and whose clock "now" is
// read from. Over any window [s, e] a key admits at most burst + (e−s)/T
// tokens.
//
// The interval of a rate that is not a whole number of nanoseconds per token
// is rounded up (3 per second: T = 333333334 ns), in every store and in
// sharedbucket alike. Why up: the admitted rate is then never above the
// configured one (it is below it by less than a nanosecond per token), and
// every store gives the same answer at the same times.
//
// Time: a store decides without waiting, so it takes no clock from a
// context; as in package sharedbucket, "now" is a reading of a monotonic
// clock in nanoseconds. The memory store reads the host's (a
// testing/synctest bubble's inside one) or the function given with
// WithClock, for tests that move time by hand; the Redis store reads the
// Redis server's. Package sharedbucket takes the same reading per call (its
// …At calls) instead, since Store.Allow has no time to pass.
package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// MaxTolerance is the largest burst·interval a Policy may have (about 52 days).
// Why a bound: the Redis store computes in Lua doubles, which are exact only up
// to 2^53; keeping τ below 2^52 ns keeps every intermediate sum exact there and
// far from int64 overflow everywhere else.
const MaxTolerance = time.Duration(1 << 52)

// ErrCostExceedsBurst is returned when a request asks for more tokens than the
// policy's burst: such a request can never be allowed, so no finite retry time
// exists.
var ErrCostExceedsBurst = errors.New("store: cost exceeds burst; it can never be allowed")

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

// ErrClosed is returned by a Store used after Close.
var ErrClosed = errors.New("store: closed")

// Policy is one rate limit: Rate tokens per second refill a bucket that holds
// at most Burst tokens. The bucket of a key never seen before is full.
//
// [github.com/sluice-go/sluice/sharedbucket.Policy] states the same bucket as Limit tokens per Window
// (Burst 0 meaning Limit). From one to the other:
//
//	store.Policy{Rate: float64(sp.Limit) / sp.Window.Seconds(), Burst: sp.Burst} // sp.Burst 0: use sp.Limit
//	sharedbucket.Policy{Limit: 1, Window: p.Interval(), Burst: p.Burst}          // what the shm store opens
//
// The second is exact (the same emission interval, rounded up to a whole
// nanosecond as both packages round); the first may differ from sp's
// interval by the rounding of Rate.
type Policy struct {
	// Name labels the policy in headers and metrics ("default" or the
	// configured key). It takes no part in the arithmetic.
	Name  string
	Rate  float64 // tokens per second, > 0
	Burst int64   // bucket capacity, ≥ 1
}

// Interval is the GCRA emission interval T: the time one token takes to
// refill, 1s/Rate rounded up to a whole nanosecond.
//
// Why up and not to the nearest: a T rounded down would let a key through
// faster than Rate (3 per second at 333333333 ns would admit 3.000000003 per
// second), while a T rounded up keeps the admitted rate at most Rate, below
// it by less than a nanosecond per token. sharedbucket.Policy rounds the same
// way, so the shm store agrees with this one.
func (p Policy) Interval() time.Duration {
	return time.Duration(math.Ceil(float64(time.Second) / p.Rate))
}

// Tolerance is τ = Burst·T: how far ahead of now a key's theoretical arrival
// time may run before requests are denied (the time a drained bucket takes to
// become full again).
func (p Policy) Tolerance() time.Duration { return time.Duration(p.Burst) * p.Interval() }

// Validate reports why p cannot be used, naming the bad value.
func (p Policy) Validate() error {
	switch {
	case math.IsNaN(p.Rate) || math.IsInf(p.Rate, 0) || p.Rate <= 0:
		return fmt.Errorf("rate %v: must be a positive finite number", p.Rate)
	case p.Rate > 1e9:
		return fmt.Errorf("rate %v: above 1e9 tokens per second", p.Rate)
	case p.Burst < 1:
		return fmt.Errorf("burst %d: must be at least 1", p.Burst)
	case float64(time.Second)/p.Rate >= float64(MaxTolerance):
		// Before Interval, whose conversion of a quotient past any
		// Duration is undefined (it wraps negative on amd64).
		return fmt.Errorf("rate %v: one token would take %.4gs to refill, over the %v maximum", p.Rate, 1/p.Rate, MaxTolerance)
	case p.Interval() < 1:
		return fmt.Errorf("rate %v: emission interval rounds to zero", p.Rate)
	case float64(p.Burst)*float64(p.Interval()) >= float64(MaxTolerance):
		return fmt.Errorf("burst %d at rate %v: refilling the bucket would take %v, over the %v maximum",
			p.Burst, p.Rate, time.Duration(float64(p.Burst)*float64(p.Interval())), MaxTolerance)
	}
	return nil
}

// Result is one decision.
type Result struct {
	Allowed bool
	// Remaining is the number of tokens in the bucket after the decision; it
	// may be fractional (0.3 means a third of a token has refilled).
	Remaining float64
	// RetryAfter is, for a denial, how long until the same request would be
	// allowed if nobody else spends meanwhile; zero when allowed.
	RetryAfter time.Duration
	// ResetAfter is how long until the bucket is full again.
	ResetAfter time.Duration
}

// Store keeps one GCRA state per key. Implementations are safe for concurrent
// use by many goroutines.
type Store interface {
	// Allow spends cost tokens of key's bucket under p if they are there and
	// reports the decision. A denial changes nothing. Callers must pass
	// 1 ≤ cost ≤ p.Burst (otherwise ErrCostExceedsBurst or a panic-free error)
	// and a valid p. A non-nil error means no decision was made; the request
	// may or may not have been counted only when the store says so in its
	// docs (the Redis store after a timeout).
	Allow(ctx context.Context, key string, cost int64, p Policy) (Result, error)
	// Keys reports how many keys the store holds state for (an estimate for
	// stores that cannot count cheaply).
	Keys(ctx context.Context) (int64, error)
	// Ping reports whether the store can make decisions now.
	Ping(ctx context.Context) error
	// Name is a short word for logs and metrics: "memory", "shm" or "redis".
	Name() string
	// Close releases the store's resources. Later calls return ErrClosed.
	Close() error
}
