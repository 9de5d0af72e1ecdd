package sharedbucket

import (
	"sync/atomic"
	"time"
)

// Bucket is a handle on one key's bucket in a Table: the single hot key of
// a service, or a Table used as one host-wide bucket. It hashes the key
// once and remembers the key's slot, so a call is a check of the slot's key
// word, a clock read and (when allowed) one CAS.
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
// TryAcquire.
func (t *Table) Bucket(key string) *Bucket {
	b := &Bucket{t: t}
	if len(key) != 0 && len(key) <= MaxKeyLen {
		b.h = hashKey(t.k0, t.k1, key)
		if s := t.find(b.h); s != nil {
			b.s.Store(s)
		}
	}
	return b
}

// TryAcquire spends n tokens if the bucket has them and reports whether it
// did; a denial changes nothing. It returns false for n outside [1, burst].
// It is the Bucket form of Table.AllowN.
func (b *Bucket) TryAcquire(n int64) bool {
	t := b.t
	if b.h == 0 || n < 1 || n > t.burst || t.closed.Load() {
		return false
	}
	return b.acquire(n, 0, true)
}

// TryAcquireAt is TryAcquire at an explicit time (see Table.AllowAt).
func (b *Bucket) TryAcquireAt(n, now int64) bool {
	t := b.t
	if b.h == 0 || n < 1 || n > t.burst || t.closed.Load() || !validNow(now) {
		return false
	}
	return b.acquire(n, now, false)
}

func (b *Bucket) acquire(n, now int64, live bool) bool {
	t := b.t
	if live {
		now = t.now()
	}
	s := b.s.Load()
	if s == nil || s.key.Load() != b.h {
		// First use, or the slot was reclaimed (the bucket was full) or
		// evicted: find or claim the key's slot again.
		if s = t.slotFor(b.h, now); s != nil {
			b.s.Store(s)
		}
	}
	var ok bool
	if s == nil {
		ok = t.contended()
	} else {
		ok = t.spend(s, n, now, live)
	}
	t.counts.add(ok)
	return ok
}

// Available returns the tokens the bucket holds now, as a fraction in
// [0, burst]. It writes nothing.
func (b *Bucket) Available() float64 { return b.available(0, true) }

// AvailableAt is Available at an explicit time (see Table.AllowAt).
func (b *Bucket) AvailableAt(now int64) float64 {
	if !validNow(now) {
		return 0
	}
	return b.available(now, false)
}

func (b *Bucket) available(now int64, live bool) float64 {
	if b.h == 0 || b.t.closed.Load() {
		return 0
	}
	return b.t.remaining(b.debt(now, live))
}

// RetryAfter returns how long until TryAcquire(n) would succeed if nobody
// else spends meanwhile (0 if it would now), or Never when it cannot.
func (b *Bucket) RetryAfter(n int64) time.Duration {
	if b.h == 0 || n < 1 || n > b.t.burst || b.t.closed.Load() {
		return Never
	}
	return b.t.retryAfter(b.debt(0, true), n)
}

func (b *Bucket) debt(now int64, live bool) int64 {
	s := b.s.Load()
	if s == nil || s.key.Load() != b.h {
		if s = b.t.find(b.h); s == nil {
			return 0
		}
	}
	return b.t.debtOf(s, now, live)
}
