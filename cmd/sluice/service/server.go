package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
	"github.com/sluice-go/sluice/internal/decide"
	"github.com/sluice-go/sluice/internal/limitresponse"
	"github.com/sluice-go/sluice/internal/selfbound"
	"github.com/sluice-go/sluice/store"
)

// Defaults for Config fields left zero.
const (
	DefaultMaxBodyBytes = 4 << 10
	DefaultStoreTimeout = 250 * time.Millisecond
	DefaultBodyTimeout  = 10 * time.Second
	// DefaultReloadTimeout bounds one rules reload (Config.ReloadTimeout):
	// reading and parsing an 8 MiB file of some 100,000 rules takes about
	// 2 s of CPU, so this leaves room for a loaded machine.
	DefaultReloadTimeout = 30 * time.Second
)

// Config configures a Server. Store and Default are required.
type Config struct {
	Store store.Store
	// Default is the policy of keys not in Limits; its Name defaults to
	// "default". Policy names must be printable ASCII (they are sent in
	// RateLimit-Policy), the rule httplimit applies too.
	Default store.Policy
	// Limits are per-key overrides, as ParseLimits returns them; an empty
	// Name becomes the key, or "limit-1" when the key is not a valid name.
	Limits map[string]store.Policy
	// Shadow makes the server decide and count but answer every decision as
	// allowed (the response carries "shadow_denied":true where it would deny).
	Shadow bool
	// Fail answers a failed store's requests: store.FailOpen (the default,
	// as is the zero FailMode) allows them, store.FailClosed denies them
	// (429 with Retry-After: 1). Either way the body says "degraded" and the
	// error is counted. Wrap a store that waits on the network in
	// store.NewBreaker (as `sluice serve` does) so that answering per Fail
	// during an outage takes microseconds, not StoreTimeout.
	Fail store.FailMode
	// StoreTimeout bounds one store call (default DefaultStoreTimeout).
	StoreTimeout time.Duration
	// MaxBodyBytes caps a POST body (default DefaultMaxBodyBytes); larger
	// bodies get 413.
	MaxBodyBytes int64
	// BodyTimeout bounds reading a POST body (default DefaultBodyTimeout): a
	// client that sends its body slowly gets 400 when it passes, so it
	// cannot hold a connection by dripping bytes. Only requests with a body
	// pay for this deadline, so the http.Server needs no ReadTimeout (which
	// arms a timer for every request). It is set through
	// http.ResponseController; a ResponseWriter that cannot set deadlines
	// leaves the body to the server's own limits.
	BodyTimeout time.Duration
	Logger      *slog.Logger         // default slog.Default()
	Registry    *prometheus.Registry // default NewRegistry()
	// Rules are envoyproxy/ratelimit rules (package rules) for Envoy's
	// ShouldRateLimit and for /allow (see HTTPDomain); nil means none.
	// SetRules and ReloadRules replace them while serving.
	Rules *rules.Config
	// RulesOptions are how ReloadRules combines its files (MergeDomains);
	// load Rules with the same.
	RulesOptions rules.Options
	// ReloadTimeout bounds one ReloadRules (default DefaultReloadTimeout):
	// past it the reload is given up and the rules in force stay.
	ReloadTimeout time.Duration
	// MaxOverrides caps the distinct Envoy limit overrides (requests_per_unit
	// and unit) that get buckets (default DefaultMaxOverrides; negative:
	// none). A process keeps the first it sees; a new one past the cap is
	// answered as if the descriptor carried no override, counted in
	// sluice_override_over_cap_total and logged at most once a minute.
	MaxOverrides int
	// HTTPDomain is the rules domain in which /allow?key=K is looked up, as
	// the descriptor [("key", K)] (default DefaultHTTPDomain). A key that
	// matches no rule there is limited by Limits or Default as without rules.
	HTTPDomain string
	// ClientNames, when not empty, are the only clients that may ask for
	// decisions and leases (/allow, ShouldRateLimit, /lease, RenewLease):
	// each must have presented a
	// client certificate verified by the TLS server (mutual TLS) whose DNS,
	// URI or email SAN or subject common name is one of them. Anyone else
	// gets 403 (gRPC: PermissionDenied) with the reason, counted in
	// sluice_client_refused_total. /healthz stays open.
	ClientNames []string
	// SplitAdmin serves /stats and /metrics only on AdminHandler, so that
	// they can listen on an address of their own (`serve -admin-addr`).
	SplitAdmin bool
	// StopOverLimitIncrement makes a ShouldRateLimit request that is over
	// the limit on any descriptor spend nothing on the others
	// (envoyproxy/ratelimit's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT). The
	// store must implement store.AllOrNothing (the memory, shm and Redis
	// stores do); on Redis the request's buckets are decided in one script
	// call, atomically.
	StopOverLimitIncrement bool
	// Leases, when not nil, serves POST /lease: capacity leases for
	// replicas that decide locally (see LeaseConfig).
	Leases *LeaseConfig
	// UIHideKeys makes the page at /ui show keys as keyed hashes, not as
	// sent (keys can be personal data: client IPs, user names).
	UIHideKeys bool
}

// Server answers /allow, /stats, /healthz, /metrics and /ui, and Envoy's
// ShouldRateLimit once registered (RegisterRateLimitService). Create it with New;
// it is safe for concurrent use. It does not own the store: closing it is the
// caller's business.
type Server struct {
	cfg     Config
	log     *slog.Logger
	mux     *http.ServeMux
	metrics *metrics

	def      policyEntry
	byKey    map[string]*policyEntry // read-only after New
	storeLat prometheus.Observer
	storeErr prometheus.Counter

	gate *decide.Gate // the store call, StoreTimeout and the fail mode

	// What /stats and Stats report; see Stats.
	allowed, denied, shadowDenied, degraded, canceled atomic.Int64

	clients *clientNames // nil: everyone may ask
	leases  *leases      // nil: no /lease
	admin   *http.ServeMux

	rules       atomic.Pointer[ruleSet] // nil: no rules
	setMu       sync.Mutex              // serialises setRules
	loading     chan struct{}           // holds a token while a rules load runs (loadRules)
	ruleMetrics ruleMetrics
	overrides   overrides // Envoy limit overrides with buckets

	ui        uiStats     // the page at /ui (ui.go, uistats.go)
	uiSampler atomic.Bool // RunUI is sampling
}

// policyEntry is a policy with its response writer and metric series. It
// is built in place (initEntry) and never copied: ctrs is published once.
type policyEntry struct {
	p    store.Policy
	resp *limitresponse.Policy // headers and body, shared with httplimit; nil for a rule without a bucket
	m    *metrics
	ui   *uiPolicy // the page's counters; nil: none
	// ctrs are the policy's series, bound at its first decision (counters).
	// Why not at load: a rules file may hold a hundred thousand rules,
	// most of which never decide anything; six series each cost kilobytes
	// and a scrape's time.
	ctrs atomic.Pointer[policyCounters]
}

// counters returns e's series, creating them at the first call.
func (e *policyEntry) counters() *policyCounters {
	if c := e.ctrs.Load(); c != nil {
		return c
	}
	// Two racing first calls bind the same children (same labels): either
	// result will do.
	e.ctrs.CompareAndSwap(nil, e.m.forPolicy(e.p.Name))
	return e.ctrs.Load()
}

// New checks cfg and returns a Server.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil {
		return nil, errors.New("service: Config.Store is nil")
	}
	if _, ok := cfg.Store.(store.AllOrNothing); cfg.StopOverLimitIncrement && !ok {
		return nil, fmt.Errorf("service: StopOverLimitIncrement: the %s store cannot decide several descriptors as one", cfg.Store.Name())
	}
	if cfg.Default.Name == "" {
		cfg.Default.Name = "default"
	}
	if err := cfg.Default.Validate(); err != nil {
		return nil, fmt.Errorf("service: default policy: %w", err)
	}
	if err := limitresponse.CheckName(cfg.Default.Name); err != nil {
		return nil, fmt.Errorf("service: default policy: %w", err)
	}
	if cfg.StoreTimeout <= 0 {
		cfg.StoreTimeout = DefaultStoreTimeout
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = DefaultBodyTimeout
	}
	if cfg.ReloadTimeout <= 0 {
		cfg.ReloadTimeout = DefaultReloadTimeout
	}
	switch {
	case cfg.MaxOverrides == 0:
		cfg.MaxOverrides = DefaultMaxOverrides
	case cfg.MaxOverrides < 0:
		cfg.MaxOverrides = 0
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = NewRegistry()
	}
	s := &Server{cfg: cfg, log: cfg.Logger, metrics: newMetrics(cfg.Registry), byKey: make(map[string]*policyEntry, len(cfg.Limits)),
		loading: make(chan struct{}, 1)}
	s.ui.off = uiOff
	s.initUI()
	s.initEntry(&s.def, cfg.Default)
	s.def.counters() // the flag-given policies' series show from the start
	s.def.ui = s.uiFlag("default", s.def.p)
	for k, p := range cfg.Limits {
		if err := p.Validate(); err != nil {
			return nil, fmt.Errorf("service: limit for key %q: %w", k, err)
		}
		if p.Name == "" {
			p.Name = policyName(k, 0)
		} else if err := limitresponse.CheckName(p.Name); err != nil {
			return nil, fmt.Errorf("service: limit for key %q: %w", k, err)
		}
		e := new(policyEntry)
		s.initEntry(e, p)
		e.counters()
		e.ui = s.uiFlag("limit", p)
		s.byKey[k] = e
	}
	// The store's resources for the flag-given policies, held for the
	// Server's life: a reload releases the rules' (see SetRules), and a
	// table the default shares with a dropped rule must stay.
	for _, e := range s.ownEntries() {
		if err := s.prepare(e.p); err != nil {
			return nil, fmt.Errorf("service: %w", err)
		}
	}
	s.initOverrides()
	if err := s.initRules(); err != nil {
		return nil, err
	}
	s.gate = decide.New(decide.Config{Store: cfg.Store, Timeout: cfg.StoreTimeout, Fail: cfg.Fail, Timed: true,
		Log: s.log, OnOutage: s.uiOutage})
	if c := newPolicyCollector(cfg.Store, s.policyList()); c != nil {
		cfg.Registry.MustRegister(c)
	}
	s.storeLat = s.metrics.storeLatency.WithLabelValues(cfg.Store.Name())
	s.storeErr = s.metrics.storeErrors.WithLabelValues(cfg.Store.Name())
	s.uiLatencyStart()

	s.clients = newClientNames(cfg.ClientNames, cfg.Registry)
	if err := s.initLeases(cfg.Leases); err != nil {
		return nil, err
	}

	s.admin = http.NewServeMux()
	s.admin.HandleFunc("/stats", s.handleStats)
	s.admin.HandleFunc("/healthz", s.handleHealthz)
	s.admin.Handle("/metrics", promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{}))
	s.admin.HandleFunc("/ui", s.handleUI)
	s.admin.HandleFunc("/ui/", s.handleUI)
	s.admin.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.fail(w, http.StatusNotFound, "no such endpoint %q on the admin address: try /stats, /healthz, /metrics, /ui", r.URL.Path)
	})
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("/allow", s.handleAllow)
	s.mux.HandleFunc("/lease", s.handleLease)
	s.mux.HandleFunc("/healthz", s.handleHealthz)
	if cfg.SplitAdmin {
		s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			s.fail(w, http.StatusNotFound, "no such endpoint %q: try /allow?key=K or /healthz (/stats, /metrics and /ui are on the admin address)", r.URL.Path)
		})
	} else {
		s.mux.HandleFunc("/stats", s.handleStats)
		s.mux.Handle("/metrics", promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{}))
		s.mux.HandleFunc("/ui", s.handleUI)
		s.mux.HandleFunc("/ui/", s.handleUI)
		s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			s.fail(w, http.StatusNotFound, "no such endpoint %q: try /allow?key=K, /stats, /healthz, /metrics, /ui", r.URL.Path)
		})
	}
	return s, nil
}

// AdminHandler serves /stats, /healthz, /metrics and /ui: what an operator
// reads, and nothing that spends. With Config.SplitAdmin it is the only
// place /stats and /metrics are served.
func (s *Server) AdminHandler() http.Handler { return s.admin }

// ownEntries are the default policy's entry and those of Limits.
func (s *Server) ownEntries() []*policyEntry {
	es := []*policyEntry{&s.def}
	for _, e := range s.byKey {
		es = append(es, e)
	}
	return es
}

// initEntry makes *e the entry of the valid, named policy p, with no
// series yet (see policyEntry.counters).
func (s *Server) initEntry(e *policyEntry, p store.Policy) {
	e.p, e.m, e.resp = p, s.metrics, limitresponse.NewPolicy(p)
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Why /allow skips the mux: it is nearly every request, and its exact
	// path routes to the handler the mux would pick anyway, so matching the
	// mux's patterns would be work spent on every decision for nothing.
	if r.URL.Path == "/allow" {
		s.handleAllow(w, r)
		return
	}
	s.mux.ServeHTTP(w, r)
}

func (s *Server) policy(key string) *policyEntry {
	if e, ok := s.byKey[key]; ok {
		return e
	}
	return &s.def
}

func (s *Server) handleAllow(w http.ResponseWriter, r *http.Request) {
	if s.clients != nil && !s.allowHTTP(w, r) {
		return
	}
	var a allowArgs
	switch r.Method {
	case http.MethodGet:
	case http.MethodPost:
		if status, err := s.readBody(w, r, &a); err != nil {
			s.fail(w, status, "%v", err)
			return
		}
	default:
		w.Header().Set("Allow", "GET, POST")
		s.fail(w, http.StatusMethodNotAllowed, "method %s not allowed on /allow: use GET or POST", r.Method)
		return
	}
	if err := parseAllowQuery(r.URL.RawQuery, &a); err != nil {
		s.fail(w, http.StatusBadRequest, "%v", err)
		return
	}
	if err := a.validate(); err != nil {
		s.fail(w, http.StatusBadRequest, "%v", err)
		return
	}
	if s.allowByRule(w, r, &a) {
		return
	}
	e := s.policy(a.key)
	if a.n > e.p.Burst {
		s.fail(w, http.StatusBadRequest, "n=%d exceeds the burst %d of policy %q: it can never be allowed", a.n, e.p.Burst, e.p.Name)
		return
	}

	v, err := s.decide(r.Context(), allowKey(a.key), a.n, e, s.cfg.Shadow)
	s.answer(w, e, v, err)
}

// readBody reads a POST body (capped) and takes key and n from it when it is
// a form. It returns the HTTP status for an error.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, a *allowArgs) (int, error) {
	if r.ContentLength != 0 { // unknown (-1) or some: a body is coming
		// An error means w cannot set deadlines (a test's recorder, or a
		// wrapper without Unwrap): then the server's own limits apply.
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout))
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return http.StatusRequestEntityTooLarge, fmt.Errorf("request body over %d bytes", tooBig.Limit)
		}
		return http.StatusBadRequest, fmt.Errorf("reading body: %v", err)
	}
	if len(body) == 0 {
		return 0, nil
	}
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ct != "application/x-www-form-urlencoded" {
		return http.StatusUnsupportedMediaType, fmt.Errorf("body of type %q: send key and n in the query or as application/x-www-form-urlencoded", ct)
	}
	if err := parseAllowQuery(string(body), a); err != nil {
		return http.StatusBadRequest, err
	}
	return 0, nil
}

// writeDegraded answers a request the store could not decide, per Fail.
func (s *Server) writeDegraded(w http.ResponseWriter, e *policyEntry) {
	e.resp.WriteDegraded(w, s.failOpen())
}

// failOpen reports whether a failed store's requests are allowed.
func (s *Server) failOpen() bool { return s.cfg.Fail != store.FailClosed }

func (s *Server) writeDecision(w http.ResponseWriter, e *policyEntry, res store.Result, shadowDenied bool) {
	e.resp.WriteDecision(w, res, shadowDenied)
}

// fail writes a JSON error {"error": "..."} with status. Nothing is counted
// but the refusal itself.
func (s *Server) fail(w http.ResponseWriter, status int, format string, args ...any) {
	s.metrics.badRequests.WithLabelValues(strconv.Itoa(status)).Inc()
	writeJSON(w, status, map[string]string{"error": fmt.Sprintf(format, args...)})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func (s *Server) handleStats(w http.ResponseWriter, r *http.Request) {
	if !s.getOnly(w, r) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	defer cancel()
	keys, err := s.cfg.Store.Keys(ctx)
	st := s.Stats()
	out := struct {
		Keys         int64  `json:"keys"`
		Allowed      int64  `json:"allowed_total"`
		Denied       int64  `json:"denied_total"`
		ShadowDenied int64  `json:"shadow_denied_total"`
		Degraded     int64  `json:"degraded_total"`
		Canceled     int64  `json:"canceled_total"`
		StoreError   string `json:"store_error,omitempty"`
		// Policies: per policy, evictions and contended decisions, and
		// the slots' health, for stores that can loosen under pressure
		// (shm).
		Policies map[string]PolicyEvictions `json:"policies,omitempty"`
	}{keys, st.Allowed, st.Denied, st.ShadowDenied, st.Degraded, st.Canceled, "", s.evictionStats()}
	if err != nil {
		out.Keys, out.StoreError = -1, err.Error()
	}
	writeJSON(w, http.StatusOK, out)
}

// Stats counts what a Server has answered to /allow (and, one per
// descriptor with a rule, to ShouldRateLimit) since New, the same
// split as the sluice_decisions_total metric.
type Stats struct {
	Allowed      int64 // the store allowed
	Denied       int64 // the store denied (not counting ShadowDenied)
	ShadowDenied int64 // the store denied; answered allowed because of Shadow
	Degraded     int64 // no decision (store error); answered per Fail
	Canceled     int64 // the caller gave up before the store answered
}

// Stats returns the counts so far.
func (s *Server) Stats() Stats {
	return Stats{Allowed: s.allowed.Load(), Denied: s.denied.Load(), ShadowDenied: s.shadowDenied.Load(),
		Degraded: s.degraded.Load(), Canceled: s.canceled.Load()}
}

func (s *Server) handleHealthz(w http.ResponseWriter, r *http.Request) {
	if !s.getOnly(w, r) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.StoreTimeout)
	defer cancel()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err := s.cfg.Store.Ping(ctx); err != nil {
		mode := "closed"
		if s.failOpen() {
			mode = "open"
		}
		if !errors.Is(err, store.ErrDown) { // a Breaker's error names the store already
			err = fmt.Errorf("%w (%s): %w", store.ErrDown, s.cfg.Store.Name(), err)
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprintf(w, "%v; failing %s\n", err, mode)
		return
	}
	_, _ = io.WriteString(w, "ok\n")
}

func (s *Server) getOnly(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	w.Header().Set("Allow", "GET, HEAD")
	s.fail(w, http.StatusMethodNotAllowed, "method %s not allowed on %s: use GET", r.Method, r.URL.Path)
	return false
}

// DecidesInProcess reports whether the server's store decides in this
// process (the memory and shm stores): then no call of the server waits on
// I/O, and a transport may run calls on the goroutine that read them.
func (s *Server) DecidesInProcess() bool {
	d, ok := selfbound.Of(s.cfg.Store)
	return ok && d == 0
}
