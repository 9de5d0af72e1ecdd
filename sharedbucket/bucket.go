package sharedbucket

import (
	"sync/atomic"
	"time"
)

// Bucket is a handle on one key's bucket in a Table: the single hot key of
// a service, or a Table used as one host-wide bucket. It hashes the key
// once and remembers the key's slot, so a call is a clock read, a load of
// the slot and (when allowed) one CAS. Its methods are the Table's, without
// the key: Allow, AllowN, AllowAt, Decide…, Remaining…, RetryAfter…,
// ResetAfter….
//
// A Bucket is safe for use by many goroutines at once, and shares its state
// with every other handle on the same key in any process. It follows its key
// if the slot is reclaimed or evicted. A Bucket for an invalid key (empty or
// longer than MaxKeyLen) denies everything.
type Bucket struct {
	t *Table
	h uint64               // keyed hash of the key; 0 for an invalid key
	s atomic.Pointer[slot] // the key's slot when last seen; re-checked on use
}

// Bucket returns a handle on key's bucket. It claims nothing until the first
// allowed spend.
func (t *Table) Bucket(key string) *Bucket {
	b := &Bucket{t: t}
	if len(key) != 0 && len(key) <= MaxKeyLen {
		b.h = t.hk.hash(key)
		if s := t.find(b.h); s != nil {
			b.s.Store(s)
		}
	}
	return b
}

// Allow is shorthand for AllowN(1).
func (b *Bucket) Allow() bool { return b.AllowN(1) }

// AllowN spends n tokens if the bucket has them now and reports whether it
// did; a denial changes nothing. It returns false for n outside [1, burst].
func (b *Bucket) AllowN(n int64) bool {
	if !b.valid(n) {
		return false
	}
	// Why the first pass is here and not only in decide: this is the whole
	// call for a hot key, and inlined it spares two calls and an outcome.
	// When it does not allow, the rest of a decision follows, without a
	// second first pass.
	now := b.t.now()
	s := b.s.Load()
	if s != nil {
		need := n * b.t.interval
		if _, ok := b.t.spendOnce(s, b.h, now, need, b.t.tau-need); ok {
			b.t.counts.add(true)
			return true
		}
	}
	return b.remember(s, b.t.decideRest(b.h, n, now, true, s)).ok
}

// AllowAt is AllowN at an explicit time (see Table.AllowAt).
func (b *Bucket) AllowAt(n, now int64) bool {
	if !b.valid(n) || !validNow(now) {
		return false
	}
	return b.decide(n, now, false).ok
}

// Decide is shorthand for DecideN(1).
func (b *Bucket) Decide() Decision { return b.DecideN(1) }

// DecideN is AllowN with the figures of the same decision (see
// Table.DecideN).
func (b *Bucket) DecideN(n int64) Decision {
	if !b.valid(n) {
		return Decision{RetryAfter: Never}
	}
	return b.t.decision(b.decide(n, b.t.now(), true), n)
}

// DecideAt is DecideN at an explicit time (see Table.AllowAt).
func (b *Bucket) DecideAt(n, now int64) Decision {
	if !b.valid(n) || !validNow(now) {
		return Decision{RetryAfter: Never}
	}
	return b.t.decision(b.decide(n, now, false), n)
}

func (b *Bucket) valid(n int64) bool {
	return b.h != 0 && n >= 1 && n <= b.t.burst && !b.t.closed.Load()
}

// decide spends n at now, a reading of the table's clock when live, else an
// explicit time, and remembers the slot the key was found in.
func (b *Bucket) decide(n, now int64, live bool) outcome {
	s := b.s.Load()
	return b.remember(s, b.t.decideFrom(b.h, n, now, live, s))
}

// remember keeps the slot a decision from s found the key in, and returns o.
func (b *Bucket) remember(s *slot, o outcome) outcome {
	if o.s != s && o.s != nil {
		b.s.Store(o.s)
	}
	return o
}

// Remaining returns the tokens the bucket holds now, as a fraction in
// [0, burst]. It writes nothing.
func (b *Bucket) Remaining() float64 { return b.remaining(0, true) }

// RemainingAt is Remaining at an explicit time (see Table.AllowAt).
func (b *Bucket) RemainingAt(now int64) float64 {
	if !validNow(now) {
		return 0
	}
	return b.remaining(now, false)
}

func (b *Bucket) remaining(now int64, live bool) float64 {
	if b.h == 0 || b.t.closed.Load() {
		return 0
	}
	return b.t.remaining(b.debt(now, live))
}

// RetryAfter is shorthand for RetryAfterN(1).
func (b *Bucket) RetryAfter() time.Duration { return b.RetryAfterN(1) }

// RetryAfterN returns how long until AllowN(n) would succeed if nobody
// else spends meanwhile (0 if it would now), or Never when it cannot.
func (b *Bucket) RetryAfterN(n int64) time.Duration {
	if !b.valid(n) {
		return Never
	}
	return b.t.retryAfter(b.debt(0, true), n)
}

// RetryAfterAt is RetryAfterN at an explicit time (see Table.AllowAt).
func (b *Bucket) RetryAfterAt(n, now int64) time.Duration {
	if !b.valid(n) || !validNow(now) {
		return Never
	}
	return b.t.retryAfter(b.debt(now, false), n)
}

// ResetAfter returns how long until the bucket is full again (0 if it is).
func (b *Bucket) ResetAfter() time.Duration {
	if b.h == 0 || b.t.closed.Load() {
		return 0
	}
	return time.Duration(b.debt(0, true))
}

// ResetAfterAt is ResetAfter at an explicit time (see Table.AllowAt).
func (b *Bucket) ResetAfterAt(now int64) time.Duration {
	if b.h == 0 || b.t.closed.Load() || !validNow(now) {
		return 0
	}
	return time.Duration(b.debt(now, false))
}

func (b *Bucket) debt(now int64, live bool) int64 {
	s := b.s.Load()
	if s == nil || s.key.Load() != b.h {
		s = b.t.find(b.h)
	}
	return b.t.debtOf(b.h, s, now, live)
}

// Rate is the table's refill in tokens per second: Limit per Window.
func (b *Bucket) Rate() float64 { return float64(time.Second) / float64(b.t.interval) }

// Burst is the most tokens the bucket holds: the table's burst, or 0 for an
// invalid key (whose bucket grants nothing).
func (b *Bucket) Burst() int64 {
	if b.h == 0 {
		return 0
	}
	return b.t.burst
}
