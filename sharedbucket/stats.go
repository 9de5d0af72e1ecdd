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

	Allowed    uint64 // decisions (Allow…, Decide…) that allowed
	Denied     uint64 // … that denied (bad input is not counted)
	Evicted    uint64 // live buckets this handle took over for a new key
	Contended  uint64 // calls that gave up under contention (failed open, or closed)
	Duplicates uint64 // keys this handle found claimed twice at once (see the package doc)
}

// Counters are a handle's event counts (see Stats), cheap to read: no walk
// of the table.
type Counters struct {
	Allowed, Denied, Evicted, Contended, Duplicates uint64
}

// Counters returns this handle's counts since Open. Unlike Stats it does
// not walk the table, so it suits a metrics scrape or a periodic check.
func (t *Table) Counters() Counters {
	c := Counters{
		Evicted:    t.rare.evicted.Load(),
		Contended:  t.rare.contended.Load(),
		Duplicates: t.rare.duplicates.Load(),
	}
	c.Allowed, c.Denied = t.counts.sum()
	return c
}

// Stats returns the table's statistics. Counting Keys walks the whole table,
// so Stats belongs on a status page, not in a request path.
func (t *Table) Stats() Stats {
	c := t.Counters()
	s := Stats{
		Limit:      t.policy.Limit,
		Window:     t.policy.Window,
		Burst:      t.burst,
		Interval:   time.Duration(t.interval),
		Slots:      t.nslots,
		Allowed:    c.Allowed,
		Denied:     c.Denied,
		Evicted:    c.Evicted,
		Contended:  c.Contended,
		Duplicates: c.Duplicates,
	}
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
