package sharedbucket

import (
	"fmt"
	"math"
	"time"
)

// Policy is a rate: Limit tokens per Window, with bursts of up to Burst.
//
// It is a bucket, not a fixed window: a key holds up to Burst tokens and
// regains one every Window/Limit. So at most Burst requests pass at one
// instant, and at most Burst + Limit within any interval of length Window.
// Burst 0 means Limit.
//
// store.Policy (package github.com/sluice-go/sluice/store, used by httplimit's
// middleware and the service) states the same bucket as Rate tokens per
// second and Burst: store.Policy{Rate, Burst} is
// Policy{Limit: 1, Window: p.Interval(), Burst: Burst}, the emission interval
// 1s/Rate rounded up to a whole nanosecond, as this package rounds
// Window/Limit; the other way, Rate is Limit/Window.Seconds().
type Policy struct {
	Limit  int64         // tokens per Window; must be > 0
	Window time.Duration // must be > 0 and at least Limit nanoseconds
	Burst  int64         // bucket size in tokens; 0 means Limit; never negative
}

// maxTau bounds b·T so that now + c·T and tat + c·T cannot overflow an int64
// for any CLOCK_MONOTONIC reading (which stays below 2^62 for 146 years).
const maxTau = int64(1) << 62

// canon is a validated policy in the form the arithmetic uses and the header
// stores. Two policies are the same policy iff their canon values are equal.
type canon struct {
	interval int64 // T: nanoseconds per token, ceil(Window/Limit)
	burst    int64 // b ≥ 1
}

func (c canon) tau() int64 { return c.burst * c.interval }

// String describes the canonical form ("1 per 10ms, burst 10").
func (c canon) String() string {
	return fmt.Sprintf("1 per %v, burst %d", time.Duration(c.interval), c.burst)
}

// Interval returns T = ceil(Window/Limit): the time one token takes to come
// back. Rounding up makes a limit that does not divide its window slightly
// tighter (by less than one nanosecond per token), never looser. It returns
// 0 for a policy Open would refuse.
func (p Policy) Interval() time.Duration {
	c, err := p.canon()
	if err != nil {
		return 0
	}
	return time.Duration(c.interval)
}

// Validate reports whether Open would accept p, with an error that names the
// bad value.
func (p Policy) Validate() error {
	_, err := p.canon()
	return err
}

func (p Policy) canon() (canon, error) {
	switch {
	case p.Limit <= 0:
		return canon{}, fmt.Errorf("sharedbucket: Policy.Limit = %d, must be > 0", p.Limit)
	case p.Window <= 0:
		return canon{}, fmt.Errorf("sharedbucket: Policy.Window = %v, must be > 0", p.Window)
	case p.Burst < 0:
		return canon{}, fmt.Errorf("sharedbucket: Policy.Burst = %d, must be ≥ 0 (0 means Limit)", p.Burst)
	case int64(p.Window) < p.Limit:
		return canon{}, fmt.Errorf("sharedbucket: Policy %d per %v is below 1ns per token (Window must be ≥ Limit nanoseconds)", p.Limit, p.Window)
	}
	b := p.Burst
	if b == 0 {
		b = p.Limit
	}
	w := int64(p.Window)
	t := w / p.Limit
	if w%p.Limit != 0 {
		t++
	}
	if t > (maxTau-1)/b {
		return canon{}, fmt.Errorf("sharedbucket: Policy burst %d × interval %v overflows (b·T must be < 2^62 ns)", b, time.Duration(t))
	}
	return canon{interval: t, burst: b}, nil
}

// burstOrLimit is the effective burst of a valid policy.
func (p Policy) burstOrLimit() int64 {
	if p.Burst == 0 {
		return p.Limit
	}
	return p.Burst
}

// Never is what RetryAfter and friends return when waiting cannot help: the
// cost is above the burst, below 1, or the key is invalid. Sleeping for Never
// is sleeping for ever, which is the truth.
const Never = time.Duration(math.MaxInt64)
