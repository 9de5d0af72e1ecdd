package service

import (
	"context"
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
		if err := s.initRuleEntry(&rs.entries[i], r); err != nil {
			return nil, fmt.Errorf("service: %s:%d: %w", r.File, r.Line, err)
		}
		rs.replaces = rs.replaces || len(r.Replaces) > 0
	}
	return rs, nil
}

// initRuleEntry makes *e, a zero entry, the entry of r. It builds no header
// text and binds no series: both wait for the rule's first decision.
func (s *Server) initRuleEntry(e *ruleEntry, r *rules.Rule) error {
	e.rule = r
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
			return err
		}
		p.Name = name
		s.initEntry(&e.policyEntry, p)
		e.limited = true
	} else {
		e.p, e.m = store.Policy{Name: name}, s.metrics
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
	return nil
}

// preparer is implemented by stores that hold resources per policy and can
// open them ahead of the first decision (the shm store's table files).
type preparer interface {
	Prepare(policies ...store.Policy) error
}

// releaser is implemented by stores that can let go of what Prepare opened
// (shmstore.Store.Release: close the table, remove its file unless another
// process holds it). One Release undoes one Prepare.
type releaser interface {
	Release(policies ...store.Policy)
}

// prepare opens p's resources in the store, if it has any.
func (s *Server) prepare(p store.Policy) error {
	if pr, ok := s.cfg.Store.(preparer); ok {
		return pr.Prepare(p)
	}
	return nil
}

// release undoes one prepare of each of ps, if the store can.
func (s *Server) release(ps []store.Policy) {
	if r, ok := s.cfg.Store.(releaser); ok && len(ps) > 0 {
		r.Release(ps...)
	}
}

// policies returns the policies of rs's limited rules (nil for nil rs).
func (rs *ruleSet) policies() []store.Policy {
	if rs == nil {
		return nil
	}
	var ps []store.Policy
	for i := range rs.entries {
		if e := &rs.entries[i]; e.limited {
			ps = append(ps, e.p)
		}
	}
	return ps
}

// dropSeries deletes the metric series of the policies named in old and not
// in cur, nor one of the server's own policies (default, -limits, the
// overrides'), so a reload that renames or removes rules does not leave
// their series behind for every later scrape. A decision still under way
// under old may bring a series back; the next reload that drops it again
// deletes it.
func (s *Server) dropSeries(old, cur *ruleSet) {
	if old == nil {
		return
	}
	keep := map[string]bool{s.def.p.Name: true, overrideName: true}
	for _, e := range s.byKey {
		keep[e.p.Name] = true
	}
	if cur != nil {
		for i := range cur.entries {
			keep[cur.entries[i].p.Name] = true
		}
	}
	for i := range old.entries {
		if name := old.entries[i].p.Name; !keep[name] {
			keep[name] = true // once is enough
			s.metrics.deletePolicy(name)
		}
	}
}

// SetRules makes c the rules for every later decision (nil removes them).
// Requests in flight finish under the rules they started with. A rule whose
// limit (requests_per_unit and unit) is unchanged keeps its buckets and their
// state; a rule whose limit changed starts new, full buckets (see
// rules.BucketKey). A store that holds resources per policy (the shm
// store) opens those of c's limits before c takes effect; if it cannot, the
// rules in force stay and the error says why. c's Warnings are logged once
// c is in force. Safe for concurrent use.
//
// What the rules in force held and c does not is released: the store's
// resources for limits no rule keeps (the shm store closes such a table and
// removes its file unless another process holds it), and the metric series
// of rule names c does not have.
func (s *Server) SetRules(c *rules.Config) error {
	return s.setRules(context.Background(), c)
}

// setRules is SetRules, giving up (and releasing what it prepared) if ctx
// ends before c takes effect.
func (s *Server) setRules(ctx context.Context, c *rules.Config) error {
	// Why one at a time: each set prepares its policies and releases its
	// predecessor's; two interleaved would release a set twice.
	s.setMu.Lock()
	defer s.setMu.Unlock()
	var rs *ruleSet
	if c != nil {
		var err error
		if rs, err = s.compile(c); err != nil {
			return err
		}
		var prepared []store.Policy
		for i := range rs.entries {
			e := &rs.entries[i]
			if !e.limited {
				continue
			}
			err := ctx.Err()
			if err == nil {
				err = s.prepare(e.p)
			}
			if err != nil {
				s.release(prepared)
				return fmt.Errorf("service: %s:%d: %w", e.rule.File, e.rule.Line, err)
			}
			prepared = append(prepared, e.p)
		}
		if err := ctx.Err(); err != nil {
			s.release(prepared)
			return fmt.Errorf("service: rules not applied: %w", errCause(ctx))
		}
	}
	old := s.rules.Swap(rs)
	s.release(old.policies())
	s.dropSeries(old, rs)
	if c == nil {
		s.ruleMetrics.rules.Set(0)
		return nil
	}
	s.ruleMetrics.rules.Set(float64(len(c.Rules)))
	// What loads but is likely not meant (a replaces cycle) is said at
	// each load, so a reload that brings it in is not silent.
	for _, w := range c.Warnings {
		s.log.Warn("rules warning", "warning", w.Error())
	}
	return nil
}

// ReloadRules is ReloadRulesContext with a context that never ends (the
// reload is still bounded by Config.ReloadTimeout).
func (s *Server) ReloadRules(paths ...string) error {
	return s.ReloadRulesContext(context.Background(), paths...)
}

// ReloadRulesContext loads the rules at paths (files and directories, as
// rules.LoadAll, combined per Config.RulesOptions; regular files only) and,
// if every file is good, makes them the rules in force (as SetRules). If
// any is not, the rules in force stay, all of them. Either way the outcome
// is logged and counted in sluice_config_reloads_total; the error, if any,
// names the file, line and field.
//
// It returns once the reload is done, or when ctx ends or
// Config.ReloadTimeout passes, whichever is first; then the rules in force
// stay and the error wraps ctx's (context.Canceled, DeadlineExceeded). A
// load given up on finishes reading and parsing in the background, bounded
// by the file size cap, and its result is dropped; a later reload waits
// for it (within its own bound) so that at most one load runs at a time.
// Safe for concurrent use.
func (s *Server) ReloadRulesContext(ctx context.Context, paths ...string) error {
	ctx, cancel := context.WithTimeoutCause(ctx, s.cfg.ReloadTimeout,
		fmt.Errorf("service: rules reload took over %v (Config.ReloadTimeout)", s.cfg.ReloadTimeout))
	defer cancel()
	var c *rules.Config
	err := ctx.Err()
	if err == nil {
		c, err = s.loadRules(ctx, paths)
	}
	if err == nil {
		err = s.setRules(ctx, c)
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

// loadRules runs rules.LoadAll on another goroutine and waits for it or for
// ctx. Why another goroutine: reading and parsing cannot be interrupted, and
// a reload must never hold up shutdown (the caller's ctx) for longer than
// it takes to notice.
func (s *Server) loadRules(ctx context.Context, paths []string) (*rules.Config, error) {
	select {
	case s.loading <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("service: rules reload: waiting for the previous reload's load to finish: %w", errCause(ctx))
	}
	type result struct {
		c   *rules.Config
		err error
	}
	done := make(chan result, 1)
	go func() {
		defer func() { <-s.loading }()
		c, err := rules.LoadAll(paths, s.cfg.RulesOptions)
		done <- result{c, err}
	}()
	select {
	case r := <-done:
		return r.c, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("service: rules reload given up: %w", errCause(ctx))
	}
}

// errCause is ctx's error, with its cause when that says more.
func errCause(ctx context.Context) error {
	if c := context.Cause(ctx); c != nil && c != ctx.Err() {
		return fmt.Errorf("%w: %w", c, ctx.Err())
	}
	return ctx.Err()
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
