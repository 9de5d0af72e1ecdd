// Package gcratest holds one table of GCRA cases that every implementation
// of the rule must pass: the memory store (store.Memory), the shared table
// (sharedbucket.Table), the limiter's lock-free path (ratelimiter) and the
// Redis script (cmd/sluice/redisstore's gcra.lua). Each implementation's own
// tests loop over Cases, so a change to one that the others do not share
// shows up as a failing case.
//
// The expectations are written out by hand from the definition, in whole
// nanoseconds: with interval T and tolerance tau = burst·T, a request of
// cost tokens at now, against a theoretical arrival time TAT (a history
// with no request is a full bucket, TAT ≤ now), is allowed iff
//
//	max(TAT, now) + cost·T − now ≤ tau,
//
// and then TAT becomes max(TAT, now) + cost·T; a denial changes nothing.
// Replay computes the same figures; TestCasesFollowTheDefinition checks
// the written table against it, so a typo in either shows.
package gcratest

import (
	"math"
	"time"
)

// A Case is a policy and a sequence of requests from an empty history.
type Case struct {
	Name string
	// The rate: Limit tokens per Window.
	Limit  int64
	Window time.Duration
	// Interval is the T, in whole nanoseconds, the expectations use:
	// Window/Limit rounded up, the rule of every implementation with a
	// whole-ns T (store.Policy.Interval, sharedbucket.Policy.Interval, and
	// so the Redis script, which gets T from Go). The limiter keeps the
	// exact rate instead; its test says which cases that changes.
	Interval time.Duration
	Burst    int64
	Steps    []Step
}

// A Step is one request and what the definition answers.
type Step struct {
	At   time.Duration // since the case's first request
	Cost int64

	// Never: cost is above the burst, so no wait can help. Implementations
	// say so in their own way (an error, a RetryAfter of Never, false) and
	// change nothing; the figures below are then zero and not compared.
	Never      bool
	Allowed    bool
	Remaining  float64       // tokens left after the decision: (tau − debt)/T
	RetryAfter time.Duration // 0 when allowed; else max(TAT, now) + cost·T − now − tau
	ResetAfter time.Duration // debt after the decision: how long until the bucket is full
}

// Tau is the case's tolerance, Burst·Interval, in nanoseconds.
func (c Case) Tau() int64 { return c.Burst * int64(c.Interval) }

// Cases is the shared table.
var Cases = []Case{
	{
		Name: "drain, partial refill, exact refill", Limit: 10, Window: time.Second,
		Interval: 100 * time.Millisecond, Burst: 3, // tau = 300ms
		Steps: []Step{
			{At: 0, Cost: 1, Allowed: true, Remaining: 2, ResetAfter: 100 * ms},
			{At: 0, Cost: 2, Allowed: true, Remaining: 0, ResetAfter: 300 * ms}, // drains exactly: at the boundary
			{At: 0, Cost: 1, RetryAfter: 100 * ms, Remaining: 0, ResetAfter: 300 * ms},
			{At: 30 * ms, Cost: 1, RetryAfter: 70 * ms, Remaining: 0.3, ResetAfter: 270 * ms},
			{At: 100 * ms, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 300 * ms}, // exactly when the token is back
			{At: 250 * ms, Cost: 2, RetryAfter: 50 * ms, Remaining: 1.5, ResetAfter: 150 * ms},
			{At: 300 * ms, Cost: 2, Allowed: true, Remaining: 0, ResetAfter: 300 * ms},
		},
	},
	{
		Name: "one nanosecond either side of the boundary", Limit: 1, Window: time.Second,
		Interval: time.Second, Burst: 2, // tau = 2s
		Steps: []Step{
			{At: 0, Cost: 2, Allowed: true, Remaining: 0, ResetAfter: 2 * s}, // cost = burst from full
			{At: s - 1, Cost: 1, RetryAfter: 1, Remaining: float64(s-1) / float64(s), ResetAfter: s + 1},
			{At: s, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 2 * s},
			{At: 3*s - 1, Cost: 2, RetryAfter: 1, Remaining: float64(2*s-1) / float64(s), ResetAfter: 1},
			{At: 3 * s, Cost: 2, Allowed: true, Remaining: 0, ResetAfter: 2 * s},
		},
	},
	{
		Name: "cost above the burst is never allowed and changes nothing", Limit: 10, Window: time.Second,
		Interval: 100 * time.Millisecond, Burst: 3,
		Steps: []Step{
			{At: 0, Cost: 4, Never: true},
			{At: 0, Cost: 3, Allowed: true, Remaining: 0, ResetAfter: 300 * ms},
			{At: 0, Cost: 4, Never: true},
			{At: 300 * ms, Cost: 1, Allowed: true, Remaining: 2, ResetAfter: 100 * ms},
		},
	},
	{
		Name: "a long idle gap refills to full, never beyond", Limit: 10, Window: time.Second,
		Interval: 100 * time.Millisecond, Burst: 3,
		Steps: []Step{
			{At: 0, Cost: 3, Allowed: true, Remaining: 0, ResetAfter: 300 * ms},
			{At: time.Hour, Cost: 1, Allowed: true, Remaining: 2, ResetAfter: 100 * ms},
			// Had the hour been banked, the bucket would still hold 3.
			{At: time.Hour, Cost: 3, RetryAfter: 100 * ms, Remaining: 2, ResetAfter: 100 * ms},
			{At: time.Hour, Cost: 2, Allowed: true, Remaining: 0, ResetAfter: 300 * ms},
		},
	},
	{
		Name: "one per hour", Limit: 1, Window: time.Hour,
		Interval: time.Hour, Burst: 2,
		Steps: []Step{
			{At: 0, Cost: 1, Allowed: true, Remaining: 1, ResetAfter: time.Hour},
			{At: 0, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 2 * time.Hour},
			{At: 0, Cost: 1, RetryAfter: time.Hour, Remaining: 0, ResetAfter: 2 * time.Hour},
			{At: 30 * time.Minute, Cost: 1, RetryAfter: 30 * time.Minute, Remaining: 0.5, ResetAfter: 90 * time.Minute},
			{At: time.Hour, Cost: 2, RetryAfter: time.Hour, Remaining: 1, ResetAfter: time.Hour},
			{At: time.Hour, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 2 * time.Hour},
		},
	},
	{
		// 2s/3 = 666666666.67ns, rounded up.
		Name: "3 per 2s, T = 666666667ns", Limit: 3, Window: 2 * time.Second,
		Interval: 666666667, Burst: 2, // tau = 1333333334
		Steps: []Step{
			{At: 0, Cost: 2, Allowed: true, Remaining: 0, ResetAfter: 1333333334},
			{At: 666666666, Cost: 1, RetryAfter: 1, Remaining: 666666666.0 / 666666667, ResetAfter: 666666668},
			{At: 666666667, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 1333333334},
		},
	},
	{
		// The third whole-ns T ends 1ns after 2s, where the exact rate
		// (3T = 2s) has the bucket full.
		Name: "3 per 2s, T = 666666667ns, burst 3: a ns per 3 tokens", Limit: 3, Window: 2 * time.Second,
		Interval: 666666667, Burst: 3, // tau = 2000000001
		Steps: []Step{
			{At: 0, Cost: 3, Allowed: true, Remaining: 0, ResetAfter: 2000000001},
			{At: 2 * s, Cost: 3, RetryAfter: 1, Remaining: 2000000000.0 / 666666667, ResetAfter: 1},
			{At: 2*s + 1, Cost: 3, Allowed: true, Remaining: 0, ResetAfter: 2000000001},
		},
	},
	{
		// 1s/3 = 333333333.33ns, rounded up (not to the nearest,
		// 333333333ns): never faster than the rate.
		Name: "3 per 1s, T rounded up to 333333334ns", Limit: 3, Window: time.Second,
		Interval: 333333334, Burst: 1,
		Steps: []Step{
			{At: 0, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 333333334},
			{At: 333333333, Cost: 1, RetryAfter: 1, Remaining: 333333333.0 / 333333334, ResetAfter: 1},
			{At: 333333334, Cost: 1, Allowed: true, Remaining: 0, ResetAfter: 333333334},
		},
	},
}

const (
	ms = time.Millisecond
	s  = time.Second
)

// An Outcome is a Step's answer as Replay computes it.
type Outcome struct {
	Step
	// Excess is max(TAT, now) + cost·T − now − tau: ≤ 0 allowed, and how far
	// the request is from the boundary either way (0 for a Never step).
	Excess time.Duration
}

// Replay applies the definition to c's requests, in integers, from an
// empty history: what every implementation should answer with c.Interval.
func Replay(c Case) []Outcome {
	T, tau := int64(c.Interval), c.Tau()
	tat := int64(math.MinInt64) // empty history: the bucket is full at any time
	out := make([]Outcome, len(c.Steps))
	for i, st := range c.Steps {
		o := Outcome{Step: Step{At: st.At, Cost: st.Cost}}
		now := int64(st.At)
		if st.Cost > c.Burst {
			o.Never = true
			out[i] = o
			continue
		}
		base := max(tat, now)
		next := base + st.Cost*T
		o.Excess = time.Duration(next - now - tau)
		debt := base - now
		if next-now <= tau {
			tat, debt = next, next-now
			o.Allowed = true
		} else {
			o.RetryAfter = o.Excess
		}
		o.Remaining = float64(tau-debt) / float64(T)
		o.ResetAfter = time.Duration(debt)
		out[i] = o
	}
	return out
}
