package service

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the service's Prometheus series. Children for every configured
// policy are created up front so the hot path does no label lookup.
type metrics struct {
	decisions    *prometheus.CounterVec   // policy, result
	failOpen     *prometheus.CounterVec   // policy
	storeErrors  *prometheus.CounterVec   // store
	storeLatency *prometheus.HistogramVec // store
	badRequests  *prometheus.CounterVec   // reason
}

// Decision results, the values of the "result" label.
const (
	resultAllowed      = "allowed"
	resultDenied       = "denied"
	resultShadowDenied = "shadow_denied" // denied by the store, allowed because of -shadow
	resultError        = "store_error"   // no decision; answered per -fail
	resultCanceled     = "canceled"      // the caller gave up before the store answered
)

// latencyBuckets are the store latency histogram's upper bounds, 2 µs …
// 0.5 s in 1-2-5 steps: the memory and shm stores answer in microseconds,
// Redis in hundreds of them, and a store timeout lands near the top.
var latencyBuckets = []float64{
	2e-6, 5e-6, 10e-6, 20e-6, 50e-6, 100e-6, 200e-6, 500e-6,
	1e-3, 2e-3, 5e-3, 10e-3, 20e-3, 50e-3, 100e-3, 200e-3, 500e-3,
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_decisions_total",
			Help: "Decisions for /allow and for each descriptor of Envoy's ShouldRateLimit, by policy and result (allowed, denied, shadow_denied, store_error, canceled).",
		}, []string{"policy", "result"}),
		failOpen: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_fail_open_decisions_total",
			Help: "Requests allowed without a decision because the store failed and -fail is open.",
		}, []string{"policy"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_store_errors_total",
			Help: "Requests the store did not decide: an error, a timeout, or its breaker open.",
		}, []string{"store"}),
		storeLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_store_latency_seconds",
			Help:    "Time the store took to decide one /allow request or one ShouldRateLimit descriptor.",
			Buckets: latencyBuckets,
		}, []string{"store"}),
		badRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_bad_requests_total",
			Help: "Requests refused before any decision, by HTTP status.",
		}, []string{"status"}),
	}
	reg.MustRegister(m.decisions, m.failOpen, m.storeErrors, m.storeLatency, m.badRequests)
	return m
}

// policyCounters are one policy's pre-bound counters.
type policyCounters struct {
	allowed, denied, shadowDenied, storeError, canceled, failOpen prometheus.Counter
}

func (m *metrics) forPolicy(name string) *policyCounters {
	return &policyCounters{
		allowed:      m.decisions.WithLabelValues(name, resultAllowed),
		denied:       m.decisions.WithLabelValues(name, resultDenied),
		shadowDenied: m.decisions.WithLabelValues(name, resultShadowDenied),
		storeError:   m.decisions.WithLabelValues(name, resultError),
		canceled:     m.decisions.WithLabelValues(name, resultCanceled),
		failOpen:     m.failOpen.WithLabelValues(name),
	}
}

// deletePolicy deletes the series forPolicy binds for name.
func (m *metrics) deletePolicy(name string) {
	for _, r := range []string{resultAllowed, resultDenied, resultShadowDenied, resultError, resultCanceled} {
		m.decisions.DeleteLabelValues(name, r)
	}
	m.failOpen.DeleteLabelValues(name)
}

// NewRegistry returns a Prometheus registry with the Go runtime and process
// collectors, the one `sluice serve` exposes.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}
