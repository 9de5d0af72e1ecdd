// Package selfbound marks the stores whose Allow bounds its own duration,
// so that a caller that would bound each call by a context.WithTimeout
// (internal/decide's Gate) can skip it when the store's bound is at least
// as tight. Why: a context.WithTimeout per call costs a timer, seven
// allocations and the parent's cancel bookkeeping (profiled: about 2 µs of
// `sluice serve`'s CPU per decision over Redis), while a store that queues
// its calls can bound them all with one timer.
//
// Why a marker embedded through an unexported alias and not an exported
// method: as with internal/inprocess, the mark is machinery of this module,
// not a promise to users.
package selfbound

import (
	"time"

	"github.com/sluice-go/sluice/store"
)

// Marker marks the struct that embeds it as a store that bounds each Allow
// by the duration Set gave it. The zero value marks no bound. Embed it
// through an unexported alias (type selfBound = selfbound.Marker). Set it
// before the store is shared; it is read without synchronisation.
type Marker struct{ d time.Duration }

func (m *Marker) selfBound() time.Duration { return m.d }

// Set makes m's store promise that each Allow returns within d of its
// start (d ≤ 0: no promise).
func Set(m *Marker, d time.Duration) { m.d = max(d, 0) }

// Of returns the bound s promises for each Allow, or 0 for none. It looks
// through a *store.Breaker, which adds no wait of its own (an open breaker
// answers at once; its probes run in the background).
func Of(s any) time.Duration {
	if b, ok := s.(*store.Breaker); ok {
		s = b.Unwrap()
	}
	if m, ok := s.(interface{ selfBound() time.Duration }); ok {
		return m.selfBound()
	}
	return 0
}
