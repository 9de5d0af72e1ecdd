package service

import "github.com/sluice-go/sluice/store"

// EvictionReporter is implemented by stores whose limits can loosen under
// pressure (the shm store: a table with more live keys than slots evicts
// the bucket nearest to full, and that key starts over). It reports, for
// policy p, the evictions and the decisions given up under contention
// (answered open, or closed) counted by this process.
type EvictionReporter interface {
	Evictions(p store.Policy) (evicted, contended uint64)
}

// policyList returns the server's policies, one per name, default first.
func (s *Server) policyList() []store.Policy {
	ps := []store.Policy{s.def.p}
	seen := map[string]bool{s.def.p.Name: true}
	for _, e := range s.byKey {
		if !seen[e.p.Name] {
			seen[e.p.Name] = true
			ps = append(ps, e.p)
		}
	}
	return ps
}

// PolicyEvictions is one policy's figures in /stats.
type PolicyEvictions struct {
	Evicted   uint64 `json:"evicted_total"`
	Contended uint64 `json:"contended_total"`
	PolicySlots
}

// evictionStats returns /stats' per-policy eviction figures, or nil when
// the store does not report them.
func (s *Server) evictionStats() map[string]PolicyEvictions {
	r, ok := s.cfg.Store.(EvictionReporter)
	if !ok {
		return nil
	}
	out := make(map[string]PolicyEvictions)
	for _, p := range s.policyList() {
		ev, co := r.Evictions(p)
		out[p.Name] = PolicyEvictions{Evicted: ev, Contended: co, PolicySlots: s.policySlots(p)}
	}
	return out
}
