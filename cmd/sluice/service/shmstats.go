package service

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-go/sluice/store"
)

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

// slotCollector exposes a SlotReporter's figures per policy as
// sluice_locked_slots, sluice_recovered_locks_total and
// sluice_corrupt_words_total, read at scrape time (each scrape walks the
// tables once per policy; nothing is added on the request path).
type slotCollector struct {
	r         SlotReporter
	policies  []store.Policy // one per policy name
	locked    *prometheus.Desc
	recovered *prometheus.Desc
	corrupt   *prometheus.Desc
}

func newSlotCollector(r SlotReporter, policies []store.Policy) *slotCollector {
	return &slotCollector{
		r:        r,
		policies: policies,
		locked: prometheus.NewDesc("sluice_locked_slots",
			"Slots of the policy's shm table locked now, by any process: a claim under way, or one whose process died or stopped less than sharedbucket.LockTimeout ago (older locks are taken over).",
			[]string{"policy"}, nil),
		recovered: prometheus.NewDesc("sluice_recovered_locks_total",
			"Locks of the policy's shm table this process took over from a process that died or stopped mid-claim (each may let one key start over with a full bucket).",
			[]string{"policy"}, nil),
		corrupt: prometheus.NewDesc("sluice_corrupt_words_total",
			"Impossible words (damage to the table file) this process found in the policy's shm table and reset.",
			[]string{"policy"}, nil),
	}
}

func (c *slotCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.locked
	ch <- c.recovered
	ch <- c.corrupt
}

func (c *slotCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.policies {
		locked, recovered, corrupt := c.r.SlotHealth(p)
		ch <- prometheus.MustNewConstMetric(c.locked, prometheus.GaugeValue, float64(locked), p.Name)
		ch <- prometheus.MustNewConstMetric(c.recovered, prometheus.CounterValue, float64(recovered), p.Name)
		ch <- prometheus.MustNewConstMetric(c.corrupt, prometheus.CounterValue, float64(corrupt), p.Name)
	}
}
