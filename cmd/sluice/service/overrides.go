package service

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
)

// DefaultMaxOverrides is Config.MaxOverrides when it is left zero.
//
// Why 64: each distinct override is a policy, and the shm store keeps a
// table file per policy (16 bytes a slot: 1 MiB at the default 65,536
// slots), so 64 bound the tmpfs overrides can take to 64 MiB a process. An
// Envoy route configuration names a handful of override limits; 64 leaves
// room for many times that.
const DefaultMaxOverrides = 64

// overrideName is the policy name of every limit override, in metrics and
// headers.
const overrideName = "override"

// overrideLogEvery is how often at most the refusal of an override past the
// cap is logged; every refusal is counted.
const overrideLogEvery = time.Minute

// overrideID is what makes two limit overrides the same policy.
type overrideID struct {
	rpu  uint32
	unit rules.Unit
	mult uint32 // unit_multiplier; 1 when absent
}

func (id overrideID) String() string {
	s := strconv.FormatUint(uint64(id.rpu), 10) + "/"
	if id.mult > 1 {
		s += strconv.FormatUint(uint64(id.mult), 10)
	}
	return s + string(id.unit)
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
// Lookups take no lock (a sync.Map read); admissions are serialised by mu.
type overrides struct {
	max     int
	entries sync.Map // overrideID → *ruleEntry; entries are never removed
	mu      sync.Mutex
	n       atomic.Int64 // entries; written under mu

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

// overrideOf is the identity of a limit override; its unit is empty when it
// is not one a rules file may have (year is refused there too).
func overrideOf(o *ratelimitv3.RateLimitDescriptor_RateLimitOverride) overrideID {
	unit := rules.Unit(strings.ToLower(o.GetUnit().String()))
	if unit.Duration() == 0 || unit == rules.Year {
		unit = ""
	}
	mult := uint32(1)
	if m := o.GetUnitMultiplier(); m != nil {
		mult = m.GetValue() // 0 is refused by check
	}
	return overrideID{o.GetRequestsPerUnit(), unit, mult}
}

// rule is the rule an override stands for. Its Domain is left empty: one
// entry serves every domain, and the decision fills in the request's (see
// rateLimitService.decide).
func (id overrideID) rule() *rules.Rule {
	return &rules.Rule{Name: overrideName, RequestsPerUnit: id.rpu, Unit: id.unit, UnitMultiplier: id.mult, Override: true}
}

// check reports why a limit override cannot be a policy: a unit other than
// second to month (year says so plainly), a unit_multiplier of 0, a period
// (unit × unit_multiplier, checked before it is multiplied: it may not fit
// in int64) past rules.MaxPeriod, or a rate above what the stores take.
// Its answer never depends on how full the cap is.
func (o *overrides) check(ov *ratelimitv3.RateLimitDescriptor_RateLimitOverride) error {
	id := overrideOf(ov)
	switch {
	case rules.Unit(strings.ToLower(ov.GetUnit().String())) == rules.Year:
		return fmt.Errorf("unit YEAR is not supported; at most MONTH (periods are at most %d days)", rules.MaxPeriod/(24*time.Hour))
	case id.unit == "":
		return fmt.Errorf("unit %v: want SECOND, MINUTE, HOUR, DAY or MONTH", ov.GetUnit())
	case id.mult == 0:
		return errors.New("unit_multiplier 0: want 1 or more")
	}
	if _, ok := o.entries.Load(id); ok {
		return nil // admitted, so valid
	}
	if _, err := rules.PeriodOf(id.unit, id.mult); err != nil {
		return err
	}
	if p, ok := id.rule().Policy(); ok {
		return p.Validate()
	}
	return nil
}

// override returns the entry for a checked limit override, admitting it if
// there is room; nil past the cap.
func (g *rateLimitService) override(id overrideID) *ruleEntry {
	o := &g.s.overrides
	if e, ok := o.entries.Load(id); ok {
		return e.(*ruleEntry)
	}
	if o.n.Load() >= int64(o.max) { // nothing is ever removed: full stays full, no lock needed
		o.refused(id)
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if e, ok := o.entries.Load(id); ok {
		return e.(*ruleEntry)
	}
	if o.n.Load() >= int64(o.max) {
		o.refused(id)
		return nil
	}
	e := new(ruleEntry)
	if err := g.s.initRuleEntry(e, id.rule()); err != nil { // cannot happen: check validated the policy
		o.refused(id)
		return nil
	}
	// The store's resources for the policy (a table file for the shm
	// store), held for the process's life as the entry is, so no reload
	// releases a table an override shares with a dropped rule. If they
	// cannot open now they open at the first decision, and an error there
	// is a store error, answered per -fail.
	if e.limited {
		if err := g.s.prepare(e.p); err != nil {
			o.log.Warn("cannot open the store's resources for a limit override; deciding per -fail until they open",
				"override", id.String(), "err", err)
		}
	}
	o.entries.Store(id, e)
	o.inUse.Set(float64(o.n.Add(1)))
	return e
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
