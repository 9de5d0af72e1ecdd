package sharedbucket

import "time"

// Reset refills key's bucket to full, for every process: an operator lifting
// a limit by hand. It does nothing for an unknown or invalid key.
func (t *Table) Reset(key string) {
	if len(key) == 0 || len(key) > MaxKeyLen || t.closed.Load() {
		return
	}
	h := t.hk.hash(key)
	if s := t.find(h); s != nil {
		for {
			tat := s.tat.Load()
			if s.key.Load() != h || s.tat.CompareAndSwap(tat, 0) {
				return // moved on (a full bucket's slot), or refilled
			}
		}
	}
}

// Forget refills key's bucket and gives its slot back, for every process.
// It is never required (a full bucket's slot is reclaimed on demand) but
// frees the slot early when a key is known to be finished with.
func (t *Table) Forget(key string) {
	if len(key) == 0 || len(key) > MaxKeyLen || t.closed.Load() {
		return
	}
	h := t.hk.hash(key)
	home := h & t.mask
	for i := range uint64(probeWindow) {
		s := slotAt(t.slots, (home+i)&t.mask)
		if s.key.Load() == h {
			// Forgive first, then release: a key word of 0 with a leftover
			// debt is forgiven again by whoever claims the slot next.
			s.tat.Store(0)
			s.key.CompareAndSwap(h, 0)
		}
	}
}

// Slots returns the table's slot count (a power of two).
func (t *Table) Slots() int { return t.nslots }

// Path returns the file the table is mapped from.
func (t *Table) Path() string { return t.path }

// Policy returns the table's policy as its creator gave it, with Burst made
// explicit.
func (t *Table) Policy() Policy { return t.policy }

// Interval returns T, the time one token takes to come back.
func (t *Table) Interval() time.Duration { return time.Duration(t.interval) }

// Close unmaps the table. It is safe to call while other goroutines still
// use the Table: the shared mapping is replaced in place by private
// anonymous memory, so a call already past its closed check touches valid,
// unshared memory and cannot change the table. Every later call denies.
// Close is idempotent; the private replacement (untouched, so costing no
// memory) stays reserved in the address space until the process exits.
func (t *Table) Close() error {
	if !t.closed.CompareAndSwap(false, true) {
		return nil
	}
	if t.coarse != nil {
		t.coarse.stop()
	}
	return unmapShared(t.base, t.size)
}
