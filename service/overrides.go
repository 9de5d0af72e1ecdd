package service

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-go/sluice/service/rules"
)

// DefaultMaxOverrides is Config.MaxOverrides when it is left zero.
//
// Why 64: each distinct override is a policy, and the shm store keeps a
// table file per policy (16 bytes a slot: 1 MiB at the default 65,536
// slots), so 64 bound the tmpfs overrides can take to 64 MiB a process. An
// Envoy route configuration names a handful of override limits; 64 leaves
// room for many times that.
const DefaultMaxOverrides = 64

// overrideLogEvery is how often at most the refusal of an override past the
// cap is logged; every refusal is counted.
const overrideLogEvery = time.Minute

// overrideID is what makes two limit overrides the same policy.
type overrideID struct {
	rpu  uint32
	unit rules.Unit
}

func (id overrideID) String() string {
	return strconv.FormatUint(uint64(id.rpu), 10) + "/" + string(id.unit)
}

// overrides are the limit overrides (Envoy's per-descriptor "limit") that
// ShouldRateLimit has given buckets. A process gives buckets to at most max
// distinct ones, the first it sees, and keeps them for its life: a store may
// hold resources per policy (the shm store's table files), and keeping
// admitted ones means a caller cannot churn them. An override past the cap
// is answered as if the descriptor carried none (its rule from the rules
// file, or OK when none matches): the limits the operator wrote stay in
// force, and a flood of new overrides neither denies the traffic nor lifts
// a configured limit. Each such answer is counted and, at most once a
// minute, logged.
//
// Lookups take no lock: admitted entries sit in a map that is replaced, never
// changed, under mu.
type overrides struct {
	max     int
	entries atomic.Pointer[map[overrideID]*ruleEntry]
	mu      sync.Mutex // serialises admissions

	inUse   prometheus.Gauge
	overCap prometheus.Counter

	log      *slog.Logger
	logMu    sync.Mutex // guards lastLog and unlogged
	lastLog  time.Time
	unlogged int64 // refusals since the last log line
}

func (s *Server) initOverrides() {
	o := &s.overrides
	o.max = s.cfg.MaxOverrides
	o.log = s.log
	o.entries.Store(&map[overrideID]*ruleEntry{})
	o.inUse = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_override_policies",
		Help: "Distinct Envoy limit overrides (requests_per_unit and unit) with buckets; at most -max-overrides.",
	})
	o.overCap = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_override_over_cap_total",
		Help: "Descriptors whose limit override was a new policy past -max-overrides, answered as if without the override (by their rule, or OK when none matches).",
	})
	s.cfg.Registry.MustRegister(o.inUse, o.overCap)
}

// override returns the entry for a descriptor's limit override in domain,
// admitting the override if there is room; nil (and no error) when the cap
// is reached. An override that cannot be a policy (an unknown unit, a
// unit_multiplier) is an error and takes no room.
func (g *rateLimitService) override(o *ratelimitv3.RateLimitDescriptor_RateLimitOverride) (*ruleEntry, error) {
	unit := rules.Unit(strings.ToLower(o.GetUnit().String()))
	if unit.Duration() == 0 {
		return nil, fmt.Errorf("unit %v: want SECOND, MINUTE, HOUR, DAY or MONTH", o.GetUnit())
	}
	if m := o.GetUnitMultiplier(); m != nil && m.GetValue() != 1 {
		return nil, fmt.Errorf("unit_multiplier %d: not supported", m.GetValue())
	}
	id := overrideID{o.GetRequestsPerUnit(), unit}
	ov := &g.s.overrides
	if e := (*ov.entries.Load())[id]; e != nil {
		return e, nil
	}
	return g.admit(id)
}

// admit adds id's entry if there is room.
func (g *rateLimitService) admit(id overrideID) (*ruleEntry, error) {
	ov := &g.s.overrides
	ov.mu.Lock()
	defer ov.mu.Unlock()
	old := *ov.entries.Load()
	if e := old[id]; e != nil {
		return e, nil
	}
	if len(old) >= ov.max {
		ov.refused(id)
		return nil, nil
	}
	// Domain is left empty: one entry serves every domain, and the decision
	// fills in the request's (see rateLimitService.decide).
	e, err := g.s.ruleEntry(&rules.Rule{Name: "override", RequestsPerUnit: id.rpu, Unit: id.unit, Override: true})
	if err != nil {
		return nil, err
	}
	if e.limited {
		// Open the store's resources for the policy now (a table file for
		// the shm store), so that an error shows here, once.
		if err := g.s.prepare(e.p); err != nil {
			return nil, err
		}
	}
	m := make(map[overrideID]*ruleEntry, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[id] = &e
	ov.entries.Store(&m)
	ov.inUse.Set(float64(len(m)))
	return &e, nil
}

// refused counts an override past the cap and logs it, at most once per
// overrideLogEvery, with the count since the last line.
func (o *overrides) refused(id overrideID) {
	o.overCap.Inc()
	o.logMu.Lock()
	defer o.logMu.Unlock()
	o.unlogged++
	if now := time.Now(); o.lastLog.IsZero() || now.Sub(o.lastLog) >= overrideLogEvery {
		o.log.Warn("limit override past -max-overrides: answered as if the descriptor had none (its rule, or OK without one)",
			"override", id.String(), "max_overrides", o.max, "refused", o.unlogged)
		o.lastLog, o.unlogged = now, 0
	}
}
