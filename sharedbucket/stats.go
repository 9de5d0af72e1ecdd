package sharedbucket

import "time"

// Stats describes a table. The policy fields and Keys describe the shared
// table; the counters count this handle's calls since Open (each process
// counts its own, so that no counter shared by every process is written on
// the hot path).
type Stats struct {
	Limit    int64         // tokens per Window, as the file's creator asked
	Window   time.Duration // as the file's creator asked
	Burst    int64         // b
	Interval time.Duration // T = ceil(Window/Limit)
	Slots    int           // slot count
	Keys     int           // keys whose bucket is not full now (all processes)

	Allowed   uint64 // AllowN/TryAcquire calls that returned true
	Denied    uint64 // … that returned false (bad input is not counted)
	Evicted   uint64 // live buckets this handle took over for a new key
	Contended uint64 // calls that gave up under contention (failed open, or closed)
}

// Stats returns the table's statistics. Counting Keys walks the whole table,
// so Stats belongs on a status page, not in a request path.
func (t *Table) Stats() Stats {
	s := Stats{
		Limit:     t.policy.Limit,
		Window:    t.policy.Window,
		Burst:     t.burst,
		Interval:  time.Duration(t.interval),
		Slots:     t.nslots,
		Evicted:   t.rare.evicted.Load(),
		Contended: t.rare.contended.Load(),
	}
	s.Allowed, s.Denied = t.counts.sum()
	if t.closed.Load() {
		return s
	}
	now := t.now()
	for i := range uint64(t.nslots) {
		sl := slotAt(t.slots, i)
		if k := sl.key.Load(); k != 0 && k&lockBit == 0 && sl.tat.Load() > now {
			s.Keys++
		}
	}
	return s
}
