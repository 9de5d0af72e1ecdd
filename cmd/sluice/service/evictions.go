package service

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-go/sluice/store"
)

// EvictionReporter is implemented by stores whose limits can loosen under
// pressure (the shm store: a table with more live keys than slots evicts
// the bucket nearest to full, and that key starts over). It reports, for
// policy p, the evictions and the decisions given up under contention
// (answered open, or closed) counted by this process.
type EvictionReporter interface {
	Evictions(p store.Policy) (evicted, contended uint64)
}

// evictionCollector exposes an EvictionReporter's counts per policy as
// sluice_evictions_total and sluice_contended_total, read at scrape time
// (the store counts; nothing is added on the request path).
type evictionCollector struct {
	r        EvictionReporter
	policies []store.Policy // one per policy name
	evicted  *prometheus.Desc
	contend  *prometheus.Desc
}

func newEvictionCollector(r EvictionReporter, policies []store.Policy) *evictionCollector {
	return &evictionCollector{
		r:        r,
		policies: policies,
		evicted: prometheus.NewDesc("sluice_evictions_total",
			"Live buckets the store evicted to make room for new keys (the evicted key starts over full: the limit loosened); raise -shm-slots if this grows.",
			[]string{"policy"}, nil),
		contend: prometheus.NewDesc("sluice_contended_total",
			"Decisions the store gave up under contention on one key and answered without deciding (allowed unless the table fails closed).",
			[]string{"policy"}, nil),
	}
}

func (c *evictionCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.evicted
	ch <- c.contend
}

func (c *evictionCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.policies {
		ev, co := c.r.Evictions(p)
		ch <- prometheus.MustNewConstMetric(c.evicted, prometheus.CounterValue, float64(ev), p.Name)
		ch <- prometheus.MustNewConstMetric(c.contend, prometheus.CounterValue, float64(co), p.Name)
	}
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
