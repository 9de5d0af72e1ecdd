package service

import "github.com/sluice-go/sluice/store"

// SlotReporter is implemented by stores whose buckets live in the slots of
// a table shared by processes (the shm store). A process killed or stopped
// while it moves a slot to a new key leaves the slot locked until the lock
// is taken over; damage to the table's file is reset where it is
// impossible. For policy p it reports the slots locked now (all
// processes), and the locks taken over and impossible words reset by this
// process.
type SlotReporter interface {
	SlotHealth(p store.Policy) (locked int, recovered, corrupt uint64)
}

// PolicySlots is one policy's slot figures in /stats (shm store).
type PolicySlots struct {
	Locked    int    `json:"locked_slots"`
	Recovered uint64 `json:"recovered_total"`
	Corrupt   uint64 `json:"corrupt_total"`
}

// policySlots returns p's slot figures, or zeros when the store does not
// report them.
func (s *Server) policySlots(p store.Policy) PolicySlots {
	r, ok := s.cfg.Store.(SlotReporter)
	if !ok {
		return PolicySlots{}
	}
	var ps PolicySlots
	ps.Locked, ps.Recovered, ps.Corrupt = r.SlotHealth(p)
	return ps
}
