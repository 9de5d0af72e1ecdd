package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluice-go/sluice/cmd/sluice/redisstore"
	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/sharedbucket"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/shmstore"
)

// ServeOptions are the settings of `sluice serve`.
type ServeOptions struct {
	Addr         string
	Rate         float64
	Burst        int64
	Limits       string
	Sweep        time.Duration
	ShmSlots     int
	Store        string
	Shadow       bool
	Fail         string
	StoreTimeout time.Duration
	LogFormat    string
	GRPC         string // Envoy RateLimitService address; "" for none
	// Config are the envoyproxy/ratelimit rules files and directories
	// (each -config adds one); none for no rules.
	Config       []string
	ConfigPoll   time.Duration
	MergeDomains bool // -merge-domain-config
	HTTPDomain   string
	MaxOverrides int
	// TLS on both ports: a certificate and key, and for mutual TLS the
	// CAs that sign client certificates (see Certs).
	TLSCert, TLSKey, ClientCA string
	TLSPoll                   time.Duration
	ClientNames               string // -client-names, comma-separated
	AdminAddr                 string // /stats and /metrics here, not on Addr; "" for Addr
	StopOverLimitIncrement    bool   // -stop-over-limit-increment
	// Capacity leases (POST /lease); see service.LeaseConfig.
	Leases                       bool
	LeaseDuration, LeaseRefresh  time.Duration
	LeaseProportional            bool
	LeaseLearn                   bool
	LeaseMaxHolders, LeaseMaxAll int
	// GRPCLimits bound the gRPC port (-grpc-max-streams, -grpc-max-request,
	// -grpc-in-flight; the rest at their defaults).
	GRPCLimits GRPCLimits
	UIKeys     bool // -ui-keys: /ui shows keys as sent (else hashed)
}

func serveFlags(o *ServeOptions, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("sluice serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.Addr, "addr", "127.0.0.1:8100", "listen address")
	fs.Float64Var(&o.Rate, "rate", 10, "tokens per second for keys not in -limits (fractional allowed)")
	fs.Int64Var(&o.Burst, "burst", 10, "bucket size for keys not in -limits")
	fs.StringVar(&o.Limits, "limits", "", `per-key overrides "KEY=RATE:BURST,..." (e.g. "tenant-a=100:200,tenant-b=5:5")`)
	fs.DurationVar(&o.Sweep, "sweep", time.Minute, "memory store: how often idle (full) buckets are dropped; 0 disables, else at least 1s")
	fs.StringVar(&o.Store, "store", DefaultStore, "where buckets live: memory, shm (files in the user's runtime dir, shared by every serve on the host), shm:DIR, redis://HOST:PORT/DB, rediscluster://HOST:PORT[?addr=HOST:PORT...], redis-sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB] (user:password@ before HOST for Redis AUTH)")
	fs.IntVar(&o.ShmSlots, "shm-slots", sharedbucket.DefaultSlots,
		"shm store: keys each policy's table holds at once (rounded up to a power of two; every serve sharing the tables must agree)")
	fs.BoolVar(&o.Shadow, "shadow", false, "decide and count, but never deny (dry run)")
	fs.StringVar(&o.Fail, "fail", "open", "when the store fails: open (allow) or closed (deny)")
	fs.DurationVar(&o.StoreTimeout, "store-timeout", service.DefaultStoreTimeout,
		"bound on one store call, and on Redis dials, reads and writes")
	fs.StringVar(&o.LogFormat, "log", "text", "log format: text or json")
	fs.StringVar(&o.GRPC, "grpc", "", "also serve Envoy's rate-limit gRPC service (envoy.service.ratelimit.v3) on this address, e.g. 127.0.0.1:8081")
	fs.Func("config", "rules in envoyproxy/ratelimit's YAML format, for gRPC and /allow: a file, or a directory (every *.yaml and *.yml in it); repeat for more; reloaded on SIGHUP", func(v string) error {
		if v == "" {
			return errors.New("empty path")
		}
		o.Config = append(o.Config, v)
		return nil
	})
	fs.DurationVar(&o.ConfigPoll, "config-poll", 0, "also reload -config when a file was added, removed, or changed its size or modification time, and then held for one more check, checked this often (0: only on SIGHUP)")
	fs.BoolVar(&o.MergeDomains, "merge-domain-config", false, "let several -config files configure one domain, merged (as envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG); without it a domain in two files is an error")
	fs.StringVar(&o.HTTPDomain, "http-domain", service.DefaultHTTPDomain, "rules domain in which /allow?key=K is looked up, as the descriptor (key, K)")
	fs.Func("grpc-max-streams", fmt.Sprintf("gRPC: concurrent streams per connection; one past it is refused (REFUSED_STREAM) (default %d)", DefaultGRPCMaxStreams), func(v string) error {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil || n == 0 {
			return fmt.Errorf("%q: want a number of streams from 1 to %d", v, uint32(math.MaxUint32))
		}
		o.GRPCLimits.MaxStreams = uint32(n)
		return nil
	})
	fs.StringVar(&o.GRPCLimits.Transport, "grpc-transport", "sluice", "gRPC: sluice (unary calls answered by the connection's reader and a kept worker; a connection that starts with another call goes to grpc-go) or grpc-go (grpc-go alone)")
	fs.IntVar(&o.GRPCLimits.MaxRequestBytes, "grpc-max-request", DefaultGRPCMaxRequestBytes, "gRPC: largest request message in bytes; a larger one gets RESOURCE_EXHAUSTED")
	fs.Int64Var(&o.GRPCLimits.InFlightBytes, "grpc-in-flight", DefaultGRPCInFlightBytes, "gRPC: bytes of requests in flight server-wide, each stream counted at -grpc-max-request; a stream past it gets RESOURCE_EXHAUSTED")
	fs.IntVar(&o.MaxOverrides, "max-overrides", service.DefaultMaxOverrides,
		"distinct Envoy limit overrides given buckets (a table file each with the shm store); a new one past this is answered as if absent (0: none)")
	fs.StringVar(&o.TLSCert, "tls-cert", "", "serve HTTPS and gRPC over TLS with this certificate (PEM; with -tls-key); reloaded on SIGHUP and when the file changes")
	fs.StringVar(&o.TLSKey, "tls-key", "", "the private key of -tls-cert (PEM)")
	fs.StringVar(&o.ClientCA, "client-ca", "", "mutual TLS: require on both ports a client certificate signed by a CA in this file (PEM; needs -tls-cert)")
	fs.DurationVar(&o.TLSPoll, "tls-poll", 10*time.Second, "check the TLS files this often and reload them when they changed (0: only on SIGHUP)")
	fs.StringVar(&o.ClientNames, "client-names", "", `with -client-ca: the only client certificates that may ask for decisions and leases (/allow, ShouldRateLimit, /lease), by DNS, URI or email SAN or subject CN, comma-separated ("replica.internal,spiffe://prod/api"); others get 403 (gRPC: PermissionDenied)`)
	fs.StringVar(&o.AdminAddr, "admin-addr", "", "serve /stats, /metrics and /healthz on this address instead of -addr (with the same TLS), to keep them private")
	fs.BoolVar(&o.StopOverLimitIncrement, "stop-over-limit-increment", false, "gRPC: a request over the limit on any descriptor spends nothing on the others (envoyproxy/ratelimit's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT; on Redis in one script call)")
	fs.BoolVar(&o.Leases, "leases", true, "serve capacity leases (POST /lease): replicas hold a share of a policy and decide locally; see docs/leases.md")
	fs.DurationVar(&o.LeaseDuration, "lease-duration", 20*time.Second, "how long a lease's grant is good for")
	fs.DurationVar(&o.LeaseRefresh, "lease-refresh", 5*time.Second, "how often replicas renew their leases (at most half of -lease-duration)")
	fs.BoolVar(&o.LeaseLearn, "lease-learn", true, "after a start, grant for one -lease-duration only the capacity renewing replicas show they hold, so a restart never over-grants; false only for a server no replica can hold a lease from (the first start)")
	fs.BoolVar(&o.LeaseProportional, "lease-proportional", false, "split a policy among replicas in proportion to their demand, not max-min fair")
	fs.IntVar(&o.LeaseMaxHolders, "lease-max-holders", 10_000, "replicas that may hold a lease on one key; more are refused (too_many_holders)")
	fs.IntVar(&o.LeaseMaxAll, "lease-max-leases", 1_000_000, "leases the server holds in all; more are refused (too_many_holders)")
	fs.BoolVar(&o.UIKeys, "ui-keys", true, "the page at /ui shows the keys denied most as sent; false shows them as keyed hashes (keys can be personal data, such as client IPs)")
	return fs
}

// Serve runs `sluice serve` until ctx is cancelled, then shuts down
// gracefully: it stops accepting, lets requests in flight finish (up to 10 s)
// and closes the store.
func Serve(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o ServeOptions
	fs := serveFlags(&o, stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		_, _ = fmt.Fprintf(stderr, "sluice serve: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	cfg, err := o.config()
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "sluice serve: %v\n", err)
		return 2
	}
	var certs *Certs
	if o.TLSCert != "" || o.TLSKey != "" || o.ClientCA != "" {
		if certs, err = LoadCerts(o.TLSCert, o.TLSKey, o.ClientCA); err != nil {
			_, _ = fmt.Fprintf(stderr, "sluice serve: %v\n", err)
			return 2
		}
	}
	if o.ClientNames != "" && o.ClientCA == "" {
		_, _ = fmt.Fprintln(stderr, "sluice serve: -client-names needs -client-ca: without mutual TLS no client is named")
		return 2
	}
	for _, n := range strings.Split(o.ClientNames, ",") {
		if n = strings.TrimSpace(n); n != "" {
			cfg.ClientNames = append(cfg.ClientNames, n)
		}
	}
	if o.TLSPoll < 0 {
		_, _ = fmt.Fprintf(stderr, "sluice serve: -tls-poll %v: must not be negative\n", o.TLSPoll)
		return 2
	}
	if cfg.Rules != nil {
		debug.FreeOSMemory() // the rules parser's garbage, as after a reload (see reload)
	}
	var h slog.Handler = slog.NewTextHandler(stderr, nil)
	if o.LogFormat == "json" {
		h = slog.NewJSONHandler(stderr, nil)
	}
	log := slog.New(h)
	cfg.Logger = log
	// go-redis logs dial failures itself: through slog, so -log json stays JSON.
	redisstore.SetLogger(log)

	if os.Getenv("GOGC") == "" {
		// Why: the live heap is tiny (a few MB), so the default GOGC=100
		// collects every few thousand requests; 400 trades a few MB for
		// fewer GC cycles on the request path. GOGC in the environment wins.
		debug.SetGCPercent(400)
	}
	st, err := OpenStore(o.Store, StoreOptions{Sweep: o.Sweep, ShmSlots: o.ShmSlots, Timeout: o.StoreTimeout, Logger: log})
	if err != nil {
		log.Error("cannot open store", "store", o.Store, "err", err)
		return 1
	}
	cfg.Store = st
	if sh, ok := st.(*shmstore.Store); ok {
		policies := []store.Policy{cfg.Default}
		for _, p := range cfg.Limits {
			policies = append(policies, p)
		}
		// The rules' tables are prepared by the service (service.New), which
		// releases each one when a reload drops it: preparing them here too
		// would hold them for good.
		if err := sh.Prepare(policies...); err != nil {
			log.Error("cannot open the shm tables", "dir", sh.Dir(), "err", err)
			_ = st.Close()
			return 1
		}
		defer startEvictionWarner(ctx, sh, append(policies, rulePolicies(cfg.Rules)...), log)()
		if on, err := sh.OnTmpfs(); err == nil && !on {
			log.Warn("shm store directory is not on tmpfs: page writeback can stall decisions; prefer the default or a tmpfs DIR",
				"dir", sh.Dir())
		}
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	if perr := st.Ping(pctx); perr != nil {
		// Serve anyway: the store may come up later, and until then
		// requests follow -fail and /healthz reports it.
		log.Warn("store not reachable yet; serving per -fail", "store", st.Name(), "err", perr)
	}
	cancel()
	var extras []ServeExtra
	if o.GRPC != "" {
		if cfg.Rules == nil {
			log.Warn("-grpc without -config: no descriptor matches a rule, so every one is answered OK")
		}
		extras = append(extras, WithGRPCLimits(o.GRPC, o.GRPCLimits, nil))
	}
	if len(o.Config) > 0 {
		log.Info("rules loaded", "file", strings.Join(cfg.Rules.Files, ","), "domains", strings.Join(cfg.Rules.Domains(), ","), "rules", len(cfg.Rules.Rules))
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		extras = append(extras, WithRulesReload(o.Config, hup, o.ConfigPoll))
	}
	if o.AdminAddr != "" {
		cfg.SplitAdmin = true
		extras = append(extras, WithAdmin(o.AdminAddr, nil))
	}
	if certs != nil {
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		defer certs.Watch(hup, o.TLSPoll, log)()
		ctx = WithCerts(ctx, certs)
	}
	err = RunServer(ctx, cfg, o.Addr, log, nil, extras...)
	if cerr := st.Close(); cerr != nil {
		log.Warn("closing store", "err", cerr)
	}
	if err != nil {
		log.Error("serve failed", "err", err)
		return 1
	}
	return 0
}

// tlsMode is how a port is served, for the "listening" log lines.
func tlsMode(c *Certs) string {
	switch {
	case c == nil:
		return "off"
	case c.Mutual():
		return "mutual"
	}
	return "on"
}

// MinSweep is the shortest -sweep. Why a floor: the memory store's calls
// sweep one of its 256 shards every 256th of the interval, and a whole
// sweep walks every key, so an interval of nanoseconds made each decision
// sweep a shard (tens of times the cost of a decision) and the store's
// goroutine sweep without pause.
const MinSweep = time.Second

// config checks the flags and builds the service config (without store).
func (o *ServeOptions) config() (service.Config, error) {
	var cfg service.Config
	fail, err := store.ParseFailMode(o.Fail)
	if err != nil {
		return cfg, fmt.Errorf("-fail: %w", err)
	}
	cfg.Fail = fail
	if o.LogFormat != "text" && o.LogFormat != "json" {
		return cfg, fmt.Errorf("-log %q: want text or json", o.LogFormat)
	}
	if err := CheckStoreSpec(o.Store); err != nil {
		return cfg, err
	}
	cfg.Default = store.Policy{Name: "default", Rate: o.Rate, Burst: o.Burst}
	if err := cfg.Default.Validate(); err != nil {
		return cfg, fmt.Errorf("-rate/-burst: %w", err)
	}
	limits, err := service.ParseLimits(o.Limits)
	if err != nil {
		return cfg, err
	}
	cfg.Limits = limits
	cfg.Shadow = o.Shadow
	cfg.StoreTimeout = o.StoreTimeout
	cfg.HTTPDomain = o.HTTPDomain
	cfg.StopOverLimitIncrement = o.StopOverLimitIncrement
	if o.Leases {
		if o.LeaseMaxHolders < 1 || o.LeaseMaxAll < 1 {
			return cfg, fmt.Errorf("-lease-max-holders %d and -lease-max-leases %d must be positive", o.LeaseMaxHolders, o.LeaseMaxAll)
		}
		cfg.Leases = &service.LeaseConfig{Lease: o.LeaseDuration, Refresh: o.LeaseRefresh,
			Proportional: o.LeaseProportional, NoLearning: !o.LeaseLearn, MaxHolders: o.LeaseMaxHolders, MaxLeases: o.LeaseMaxAll}
	}
	cfg.UIHideKeys = !o.UIKeys
	switch {
	case o.MaxOverrides < 0:
		return cfg, fmt.Errorf("-max-overrides %d: must not be negative", o.MaxOverrides)
	case o.MaxOverrides == 0:
		cfg.MaxOverrides = -1 // service.Config's "none"
	default:
		cfg.MaxOverrides = o.MaxOverrides
	}
	switch {
	case o.Sweep < 0:
		return cfg, fmt.Errorf("-sweep %v: must not be negative (0 turns sweeping off)", o.Sweep)
	case o.Sweep > 0 && o.Sweep < MinSweep:
		return cfg, fmt.Errorf("-sweep %v: below the %v minimum (0 turns sweeping off)", o.Sweep, MinSweep)
	}
	switch {
	case o.ConfigPoll < 0:
		return cfg, fmt.Errorf("-config-poll %v: must not be negative", o.ConfigPoll)
	case o.ConfigPoll > 0 && len(o.Config) == 0:
		return cfg, errors.New("-config-poll needs -config")
	case o.MergeDomains && len(o.Config) == 0:
		return cfg, errors.New("-merge-domain-config needs -config")
	}
	if t := o.GRPCLimits.Transport; t != "sluice" && t != "grpc-go" && t != "" {
		return cfg, fmt.Errorf("-grpc-transport %q: want sluice or grpc-go", t)
	}
	if o.GRPCLimits.MaxRequestBytes <= 0 {
		return cfg, fmt.Errorf("-grpc-max-request %d: must be positive", o.GRPCLimits.MaxRequestBytes)
	}
	if o.GRPCLimits.InFlightBytes < int64(o.GRPCLimits.MaxRequestBytes) {
		return cfg, fmt.Errorf("-grpc-in-flight %d: must be at least -grpc-max-request (%d)", o.GRPCLimits.InFlightBytes, o.GRPCLimits.MaxRequestBytes)
	}
	if n := o.GRPCLimits.InFlightBytes / int64(o.GRPCLimits.MaxRequestBytes); n > MaxGRPCInFlightRequests {
		return cfg, fmt.Errorf("-grpc-in-flight %d admits %d requests of -grpc-max-request %d at once, over the %d maximum",
			o.GRPCLimits.InFlightBytes, n, o.GRPCLimits.MaxRequestBytes, MaxGRPCInFlightRequests)
	}
	cfg.RulesOptions.MergeDomains = o.MergeDomains
	if len(o.Config) > 0 {
		if cfg.Rules, err = loadRules(o.Config, cfg.RulesOptions); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

// RunServer serves cfg on addr until ctx is cancelled, then shuts down
// gracefully. If ready is non-nil it is called with the bound address once
// the listener is open (useful with port 0). extras (WithGRPC,
// WithRulesReload) start before the server reports listening and stop after
// the HTTP server has shut down. When ctx carries certificates (WithCerts)
// it serves HTTPS (HTTP/2 and HTTP/1.1).
func RunServer(ctx context.Context, cfg service.Config, addr string, log *slog.Logger, ready func(net.Addr), extras ...ServeExtra) error {
	srv, err := service.New(cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	defer startUI(ctx, srv)()
	hs := &http.Server{
		Handler: srv,
		// Why these, and not ReadTimeout: a client that sends its headers
		// slowly (slowloris) or goes quiet between requests must not hold
		// a connection forever; ReadHeaderTimeout and IdleTimeout bound
		// that, and a POST body gets its own read deadline
		// (service.Config.BodyTimeout), so ReadTimeout would only arm one
		// more timer per request. WriteTimeout stays although the three
		// timeouts' timers cost a few percent of the peak: without it a
		// client that sends requests and never reads the answers keeps its
		// connection, with full socket buffers (hundreds of KiB of kernel
		// memory each), for as long as it likes. docs/service.md
		// ("Timeouts") has the trade-off.
		ReadHeaderTimeout: 5 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	for _, x := range extras {
		stop, err := x(ctx, srv, log)
		if err != nil {
			_ = ln.Close()
			return err
		}
		defer stop()
	}
	certs := certsFrom(ctx)
	log.Info("listening", "addr", ln.Addr().String(), "store", cfg.Store.Name(),
		"rate", cfg.Default.Rate, "burst", cfg.Default.Burst, "limits", len(cfg.Limits),
		"shadow", cfg.Shadow, "fail_open", cfg.Fail != store.FailClosed, "tls", tlsMode(certs))
	if ready != nil {
		ready(ln.Addr())
	}
	errc := make(chan error, 1)
	if certs != nil {
		hs.TLSConfig = certs.Config("h2", "http/1.1")
		go func() { errc <- hs.ServeTLS(ln, "", "") }()
	} else {
		go func() { errc <- hs.Serve(ln) }()
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = hs.Shutdown(sctx)
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		return serr
	}
	st := srv.Stats()
	log.Info("stopped", "allowed_total", st.Allowed, "denied_total", st.Denied, "shadow_denied_total", st.ShadowDenied,
		"degraded_total", st.Degraded, "fail_open", cfg.Fail != store.FailClosed, "canceled_total", st.Canceled)
	return err
}
