// Package selfbound tells how long a store's Allow can take, for the stores
// that promise a bound, so that a caller that would bound each call by a
// context.WithTimeout (internal/decide's Gate) can skip it when the store's
// own bound is at least as tight. Two kinds of store promise one: an
// in-process store (the memory and shm stores: embed InProcess) never waits
// on I/O, and a store that queues its calls (the Redis store: embed Marker)
// bounds them all with one timer. Why skip: a context.WithTimeout per call
// costs a timer, seven allocations and the parent's cancel bookkeeping
// (profiled: about 2 µs of `sluice serve`'s CPU per decision over Redis),
// for nothing when the store cannot take that long.
//
// Why markers embedded through an unexported alias and not an exported
// method: the mark is machinery of this module, not a promise to users. An
// interface whose one method is unexported here is met only by types that
// embed a marker, and embedding it through an unexported alias keeps the
// field out of the store's exported fields and documentation.
package selfbound

import "time"

// InProcess marks the struct that embeds it as an in-process store: its
// Allow never waits on I/O. Embed it through an unexported alias (type
// inProcess = selfbound.InProcess), first in the struct, where a zero-size
// field takes no room.
type InProcess struct{}

func (InProcess) inProcess() {}

// Marker marks the struct that embeds it as a store that bounds each Allow
// by the duration Set gave it. The zero value marks no bound. Embed it
// through an unexported alias (type selfBound = selfbound.Marker). Set it
// before the store is shared; it is read without synchronisation.
type Marker struct{ d time.Duration }

func (m *Marker) selfBound() time.Duration { return m.d }

// Set makes m's store promise that each Allow returns within d of its
// start (d ≤ 0: no promise).
func Set(m *Marker, d time.Duration) { m.d = max(d, 0) }

// Of returns the bound s promises for each Allow and whether it promises
// one: 0 and true for an in-process store, which never waits; Set's d and
// true for a Marker with a bound; 0 and false otherwise. It sees only s
// itself: a caller looks through a wrapper that adds no wait of its own (a
// *store.Breaker: Gate does) before asking. Why not here: this package is
// imported by the store package, so it cannot name store.Breaker.
func Of(s any) (time.Duration, bool) {
	if _, ok := s.(interface{ inProcess() }); ok {
		return 0, true
	}
	if m, ok := s.(interface{ selfBound() time.Duration }); ok {
		d := m.selfBound()
		return d, d > 0
	}
	return 0, false
}
