package sharedbucket

import (
	"time"

	"github.com/sluice-go/sluice/internal/tablecounts"
)

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
	// Locked is the slots whose key word is locked now (all processes): a
	// claim under way, or one whose process died or stopped less than
	// LockTimeout ago. Stats first takes over every lock older than that
	// (by the host's clock, Now), counting it in Recovered, so a lock whose
	// holder died shows here for at most LockTimeout.
	Locked int

	Allowed    uint64 // decisions (Allow…, Decide…) that allowed
	Denied     uint64 // … that denied (bad input is not counted)
	Evicted    uint64 // live buckets this handle took over for a new key
	Contended  uint64 // calls that gave up under contention (failed open, or closed)
	Duplicates uint64 // claims this handle gave back to a racing claim of the same key (they cost nothing; see the package doc)
	Recovered  uint64 // locks this handle took over from a holder that died or stopped (see LockTimeout)
	Corrupt    uint64 // impossible words this handle reset: a TAT too far ahead, a lock or a key word no process wrote
}

// counts are a handle's event counts (see Stats), cheap to read: no walk of
// the table. The shm store reads them through internal/tablecounts.
type counts = tablecounts.Counts

func init() {
	tablecounts.Of = func(t any) tablecounts.Counts { return t.(*Table).counters() }
}

// counters returns this handle's counts since Open. Unlike Stats it does
// not walk the table.
func (t *Table) counters() counts {
	c := counts{
		Evicted:    t.rare.evicted.Load(),
		Contended:  t.rare.contended.Load(),
		Duplicates: t.rare.duplicates.Load(),
		Recovered:  t.rare.recovered.Load(),
		Corrupt:    t.rare.corrupt.Load(),
	}
	c.Allowed, c.Denied = t.counts.sum()
	return c
}

// Stats returns the table's statistics. Counting Keys and Locked walks the
// whole table (a load or two per slot; BenchmarkStats), so Stats belongs on
// a status page or a metrics scrape, not in a request path. On the way it takes over the locks that are LockTimeout old
// (a write, counted in Recovered), so that a scrape every so often keeps
// dead locks from lingering in windows no claim visits.
func (t *Table) Stats() Stats {
	var locked int
	var keys int
	if !t.closed.Load() {
		keys, locked = t.walk()
	}
	c := t.counters()
	s := Stats{
		Keys:       keys,
		Locked:     locked,
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
		Recovered:  c.Recovered,
		Corrupt:    c.Corrupt,
	}
	return s
}

// walk counts the live buckets and the locked slots, taking over first the
// locks that are LockTimeout old or carry no process id (see unlock).
//
// Why not the locks dated ahead of the clock, which claims reset: walk
// judges by the host's clock, and a table driven by …At calls may run on
// another clock that all its callers share; its claims judge those locks by
// their own times.
func (t *Table) walk() (keys, locked int) {
	now := nanotime()
	for i := range uint64(t.nslots) {
		sl := slotAt(t.slots, i)
		k := sl.key.Load()
		switch {
		case k&lockBit != 0:
			st := lockState(k, now)
			if st == lockInvalid && k&pidMask != 0 {
				st = lockHeld
			}
			if st == lockHeld || !t.unlock(sl, k, st) {
				locked++
			}
		case k != 0 && sl.tat.Load() > now:
			keys++
		}
	}
	return keys, locked
}
