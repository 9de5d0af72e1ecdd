package shmstore

import "github.com/sluice-go/sluice/store"

// SlotUsage reports, for p's table, the slots holding a bucket that is not
// full now (all processes' keys) and the table's slot count; zeros if p's
// table is not open. It walks the table (sharedbucket.Table.Stats), as
// SlotHealth does. Policies with the same rate and burst share one table,
// and so these figures.
func (s *Store) SlotUsage(p store.Policy) (used, slots int) {
	t := s.opened(p)
	if t == nil {
		return 0, 0
	}
	st := t.Stats()
	return st.Keys, st.Slots
}
