package service

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
	"github.com/sluice-go/sluice/internal/limitresponse"
	"github.com/sluice-go/sluice/store"
)

// DefaultHTTPDomain is the rules domain /allow keys are looked up in when
// Config.HTTPDomain is empty.
const DefaultHTTPDomain = "http"

// ruleSet is one load of the rules files, compiled for the hot path. It is
// immutable: a reload builds a new one and swaps the pointer, so a decision
// sees one whole set of files, old or new.
type ruleSet struct {
	cfg     *rules.Config
	entries []ruleEntry // by Rule.Index
	// replaces says some rule replaces others: only then does a request
	// pay for collecting the names its descriptors replace.
	replaces bool
}

// ruleEntry is a rule's policy, counters and Envoy current_limit.
type ruleEntry struct {
	policyEntry // p is zero unless limited
	rule        *rules.Rule
	limited     bool                               // has a bucket: not unlimited, requests_per_unit > 0
	limit       *rlsv3.RateLimitResponse_RateLimit // current_limit; shared, never modified
}

type ruleMetrics struct {
	reloadOK, reloadErr prometheus.Counter
	rules               prometheus.Gauge
}

func (s *Server) initRules() error {
	if s.cfg.HTTPDomain == "" {
		s.cfg.HTTPDomain = DefaultHTTPDomain
	}
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_config_reloads_total",
		Help: "Rules reloads (-config files and directories, on SIGHUP or -config-poll), by result: ok, or error (the previous rules stay).",
	}, []string{"result"})
	count := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sluice_config_rules",
		Help: "Rules (descriptors with a rate_limit) in the rules files in force.",
	})
	s.cfg.Registry.MustRegister(reloads, count)
	s.ruleMetrics = ruleMetrics{reloadOK: reloads.WithLabelValues("ok"), reloadErr: reloads.WithLabelValues("error"), rules: count}
	if s.cfg.Rules == nil {
		return nil
	}
	return s.SetRules(s.cfg.Rules)
}

func (s *Server) compile(c *rules.Config) (*ruleSet, error) {
	rs := &ruleSet{cfg: c, entries: make([]ruleEntry, len(c.Rules))}
	for i, r := range c.Rules {
		e, err := s.ruleEntry(r)
		if err != nil {
			return nil, fmt.Errorf("service: %s:%d: %w", r.File, r.Line, err)
		}
		rs.entries[i] = e
		rs.replaces = rs.replaces || len(r.Replaces) > 0
	}
	return rs, nil
}

func (s *Server) ruleEntry(r *rules.Rule) (ruleEntry, error) {
	e := ruleEntry{rule: r}
	// Why: the name goes into RateLimit-Policy headers as a structured-field
	// string, which must be printable ASCII (limitresponse.CheckName); a rule
	// keyed on other values is named after its line instead (gRPC's
	// current_limit keeps r.Name).
	name := r.Name
	if limitresponse.CheckName(name) != nil {
		name = "rule-line-" + strconv.Itoa(r.Line)
	}
	if p, ok := r.Policy(); ok {
		if err := p.Validate(); err != nil {
			return e, err
		}
		p.Name = name
		e.policyEntry, e.limited = s.entry(p), true
	} else {
		e.policyEntry = policyEntry{p: store.Policy{Name: name}, counters: s.metrics.forPolicy(name)}
	}
	e.ui = s.uiRule(r, e.p, e.limited)
	if !r.Unlimited {
		e.limit = &rlsv3.RateLimitResponse_RateLimit{
			RequestsPerUnit: r.RequestsPerUnit,
			Unit:            rlsv3.RateLimitResponse_RateLimit_Unit(rlsv3.RateLimitResponse_RateLimit_Unit_value[strings.ToUpper(string(r.Unit))]),
		}
		// Why only a written name: envoyproxy/ratelimit sends none for an
		// unnamed rule, and Envoy copies the name into its own headers and
		// logs; the generated label is for Sluice's metrics.
		if r.Named {
			e.limit.Name = r.Name
		}
		if r.UnitMultiplier > 1 {
			e.limit.UnitMultiplier = wrapperspb.UInt32(r.UnitMultiplier)
		}
	}
	return e, nil
}

// preparer is implemented by stores that hold resources per policy and can
// open them ahead of the first decision (the shm store's table files).
type preparer interface {
	Prepare(policies ...store.Policy) error
}

// prepare opens p's resources in the store, if it has any.
func (s *Server) prepare(p store.Policy) error {
	if pr, ok := s.cfg.Store.(preparer); ok {
		return pr.Prepare(p)
	}
	return nil
}

// SetRules makes c the rules for every later decision (nil removes them).
// Requests in flight finish under the rules they started with. A rule whose
// limit (requests_per_unit and unit) is unchanged keeps its buckets and their
// state; a rule whose limit changed starts new, full buckets (see
// rules.BucketKey). A store that holds resources per policy (the shm
// store) opens those of c's limits before c takes effect; if it cannot, the
// rules in force stay and the error says why. Safe for concurrent use.
func (s *Server) SetRules(c *rules.Config) error {
	if c == nil {
		s.rules.Store(nil)
		s.ruleMetrics.rules.Set(0)
		return nil
	}
	rs, err := s.compile(c)
	if err != nil {
		return err
	}
	for _, e := range rs.entries {
		if e.limited {
			if err := s.prepare(e.p); err != nil {
				return fmt.Errorf("service: %s:%d: %w", e.rule.File, e.rule.Line, err)
			}
		}
	}
	s.rules.Store(rs)
	s.ruleMetrics.rules.Set(float64(len(c.Rules)))
	return nil
}

// ReloadRules loads the rules at paths (files and directories, as
// rules.LoadAll, combined per Config.RulesOptions) and, if every file is
// good, makes them the rules in force (as SetRules). If any is not, the
// rules in force stay, all of them. Either way the outcome is logged and
// counted in sluice_config_reloads_total; the error, if any, names the file,
// line and field.
func (s *Server) ReloadRules(paths ...string) error {
	c, err := rules.LoadAll(paths, s.cfg.RulesOptions)
	if err == nil {
		err = s.SetRules(c)
	}
	s.uiReloaded(paths, c, err)
	if err != nil {
		s.ruleMetrics.reloadErr.Inc()
		s.log.Error("rules reload failed; keeping the rules in force", "config", strings.Join(paths, ","), "err", err)
		return err
	}
	s.ruleMetrics.reloadOK.Inc()
	s.log.Info("rules reloaded", "file", strings.Join(c.Files, ","), "domains", strings.Join(c.Domains(), ","), "rules", len(c.Rules))
	return nil
}

// allowByRule answers /allow when the key matches a rule of the HTTP domain
// (the descriptor [("key", K)]) and reports whether it did; it writes nothing
// when no rule matches.
func (s *Server) allowByRule(w http.ResponseWriter, r *http.Request, a *allowArgs) bool {
	rs := s.rules.Load()
	if rs == nil {
		return false
	}
	entries := [1]rules.KV{{Key: "key", Value: a.key}}
	rule := rules.Match(rs.cfg, s.cfg.HTTPDomain, entries[:])
	if rule == nil {
		return false
	}
	e := &rs.entries[rule.Index]
	shadow := s.cfg.Shadow || rule.Shadow
	switch {
	case rule.Unlimited:
		s.tally(&e.policyEntry, store.Result{Allowed: true}, shadow)
		writeJSON(w, http.StatusOK, map[string]any{"allowed": true, "unlimited": true})
	case !e.limited: // requests_per_unit: 0 denies everything
		v := s.tally(&e.policyEntry, store.Result{}, shadow)
		status, body := http.StatusTooManyRequests, map[string]any{"allowed": v.allowed, "remaining": 0, "limit": 0, "rate": 0}
		if v.shadowDenied {
			status, body["shadow_denied"] = http.StatusOK, true
		}
		writeJSON(w, status, body)
	case a.n > e.p.Burst:
		s.fail(w, http.StatusBadRequest, "n=%d exceeds the burst %d of rule %q (%s:%d): it can never be allowed",
			a.n, e.p.Burst, rule.Name, rule.File, rule.Line)
	default:
		v, err := s.decide(r.Context(), rules.BucketKey(rules.Allow, rule, entries[:]), a.n, &e.policyEntry, shadow)
		s.answer(w, &e.policyEntry, v, err)
	}
	return true
}
