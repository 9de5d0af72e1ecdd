package service

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-go/sluice/store"
)

// policyCollector exposes, per policy, what the store reports of its
// tables: an EvictionReporter's counts as sluice_evictions_total and
// sluice_contended_total, a SlotReporter's figures as sluice_locked_slots,
// sluice_recovered_locks_total and sluice_corrupt_words_total. It reads
// them at scrape time (the store counts; nothing is added on the request
// path; a SlotReporter walks its tables once per policy). Why one
// collector for both: they are the same walk over the same policies.
type policyCollector struct {
	policies []store.Policy   // one per policy name
	ev       EvictionReporter // nil when the store does not report evictions
	sl       SlotReporter     // nil when the store does not report slot health

	evicted, contended         *prometheus.Desc
	locked, recovered, corrupt *prometheus.Desc
}

// newPolicyCollector returns the collector of st's figures for policies,
// or nil when st reports none.
func newPolicyCollector(st store.Store, policies []store.Policy) *policyCollector {
	ev, _ := st.(EvictionReporter)
	sl, _ := st.(SlotReporter)
	if ev == nil && sl == nil {
		return nil
	}
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, []string{"policy"}, nil)
	}
	return &policyCollector{
		policies: policies,
		ev:       ev,
		sl:       sl,
		evicted: desc("sluice_evictions_total",
			"Live buckets the store evicted to make room for new keys (the evicted key starts over full: the limit loosened); raise -shm-slots if this grows."),
		contended: desc("sluice_contended_total",
			"Decisions the store gave up under contention on one key and answered without deciding (allowed unless the table fails closed)."),
		locked: desc("sluice_locked_slots",
			"Slots of the policy's shm table locked now, by any process: a claim under way, or one whose process died or stopped less than sharedbucket.LockTimeout ago (older locks are taken over)."),
		recovered: desc("sluice_recovered_locks_total",
			"Locks of the policy's shm table this process took over from a process that died or stopped mid-claim (each may let one key start over with a full bucket)."),
		corrupt: desc("sluice_corrupt_words_total",
			"Impossible words (damage to the table file) this process found in the policy's shm table and reset."),
	}
}

func (c *policyCollector) Describe(ch chan<- *prometheus.Desc) {
	if c.ev != nil {
		ch <- c.evicted
		ch <- c.contended
	}
	if c.sl != nil {
		ch <- c.locked
		ch <- c.recovered
		ch <- c.corrupt
	}
}

func (c *policyCollector) Collect(ch chan<- prometheus.Metric) {
	metric := func(d *prometheus.Desc, t prometheus.ValueType, v float64, p store.Policy) {
		ch <- prometheus.MustNewConstMetric(d, t, v, p.Name)
	}
	for _, p := range c.policies {
		if c.ev != nil {
			evicted, contended := c.ev.Evictions(p)
			metric(c.evicted, prometheus.CounterValue, float64(evicted), p)
			metric(c.contended, prometheus.CounterValue, float64(contended), p)
		}
		if c.sl != nil {
			locked, recovered, corrupt := c.sl.SlotHealth(p)
			metric(c.locked, prometheus.GaugeValue, float64(locked), p)
			metric(c.recovered, prometheus.CounterValue, float64(recovered), p)
			metric(c.corrupt, prometheus.CounterValue, float64(corrupt), p)
		}
	}
}
