package bench_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/sluice-go/sluice/internal/redistest"
)

// The peers the service is compared with, pinned; `go install` builds them
// from the module proxy.
const (
	envoyRatelimitPkg     = "github.com/envoyproxy/ratelimit/src/service_cmd"
	envoyRatelimitVersion = "v1.4.1-0.20260122083618-3fb702589d36"
	gubernatorPkg         = "github.com/gubernator-io/gubernator/v2/cmd/gubernator"
	gubernatorVersion     = "v2.13.0"
)

// The load: the same for every server.
const (
	peakWorkers = 32   // closed loop: calls in flight
	openWorkers = 16   // open loop: workers sharing the schedule
	openRate    = 5000 // open loop: calls a second
	grpcConns   = 4    // gRPC connections the workers share
	keyCount    = 1000 // distinct keys, each at 1000/s: the load never reaches a key's limit
)

// peersRules is envoyproxy/ratelimit's YAML, read by `sluice serve -config`
// and by envoyproxy/ratelimit alike: descriptor k at 1000/s (the load's
// keys), and check at 5/s (the decision check).
const peersRules = `domain: perf
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1000}
  - key: check
    rate_limit: {unit: second, requests_per_unit: 5}
`

// TestServiceVsPeers measures `sluice serve` against envoyproxy/ratelimit
// and gubernator on loopback, each driven by the same load loop, and prints
// a markdown table with the same-run ratios. It builds sluice from
// ../cmd/sluice, installs the peers with `go install` into the user's cache
// directory (sluice-bench/VERSION, reused by later runs; SLUICE_PEERS_BIN=DIR
// takes prebuilt service_cmd and gubernator from DIR instead), and starts
// one redis-server. Opt-in, as it takes minutes (the first run longer, to
// build the peers):
//
//	SLUICE_PEERS=1 go test -run TestServiceVsPeers -v -count=1 -timeout 30m ./bench
//
// SLUICE_PEERS_SECS (default 10) is each run's measured time, after a
// warm-up of a second. Per server and API: a decision check, then the peak
// (closed loop, 32 calls in flight) and 5000 calls/s (open loop, 16
// workers), over 1000 keys that never reach their limit, so every decision
// in the load must be an allow and any error or denial fails the test.
func TestServiceVsPeers(t *testing.T) {
	if os.Getenv("SLUICE_PEERS") == "" {
		t.Skip("set SLUICE_PEERS=1 to run (builds sluice and installs envoyproxy/ratelimit and gubernator, starts redis-server; takes minutes)")
	}
	secs := 10
	if s := os.Getenv("SLUICE_PEERS_SECS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err, "SLUICE_PEERS_SECS")
		require.Positive(t, n, "SLUICE_PEERS_SECS")
		secs = n
	}
	keys := make([]string, keyCount)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	peak := loadShape{warmup: time.Second, duration: time.Duration(secs) * time.Second, keys: keys}
	open := peak
	open.rate = openRate

	rds := redistest.Start(t)
	work := t.TempDir()
	sluice := buildSluice(t, work)
	envoyRL := peerBinary(t, "service_cmd", envoyRatelimitPkg, envoyRatelimitVersion)
	gubernator := peerBinary(t, "gubernator", gubernatorPkg, gubernatorVersion)
	// envoyproxy/ratelimit reads RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config/*.yaml.
	rulesDir := filepath.Join(work, "runtime", "ratelimit", "config")
	require.NoError(t, os.MkdirAll(rulesDir, 0o755))
	rules := filepath.Join(rulesDir, "perf.yaml")
	require.NoError(t, os.WriteFile(rules, []byte(peersRules), 0o644))
	t.Logf("load average before: %s", loadAverage())

	var rows []*serviceRow
	measure := func(t *testing.T, row *serviceRow, newDeciders func(workers int) ([]decider, func()), check decider) {
		t.Helper()
		requireDecides(t, row.name(), check, newDeciders)
		for _, run := range []struct {
			shape   loadShape
			workers int
			into    **loadResult
		}{{peak, peakWorkers, &row.peak}, {open, openWorkers, &row.open}} {
			ds, done := newDeciders(run.workers)
			r := runLoad(ds, run.shape)
			done()
			*run.into = r
			t.Logf("%s, %s: %.0f decisions/s, p50 %v, p99 %v, sent late %.1f%%; allowed %d, denied %d, errors %d",
				row.name(), map[bool]string{true: "5000/s", false: "peak"}[run.shape.rate > 0],
				r.decisionsPerSec(), r.quantile(0.5), r.quantile(0.99), 100*r.lateShare(), r.allowed, r.denied, r.bad)
			require.NotZero(t, r.allowed, "no decisions")
			require.Zero(t, r.bad, "errors, the first: %v", r.firstErr)
			require.Zero(t, r.denied, "denials: every key stays under its limit")
		}
		rows = append(rows, row)
	}
	rlsDeciders := func(t *testing.T, addr string) func(int) ([]decider, func()) {
		return func(workers int) ([]decider, func()) {
			ds, done, err := grpcDeciders(addr, grpcConns, workers, func(cc *grpc.ClientConn) decider {
				return rlsDecider{c: rlsv3.NewRateLimitServiceClient(cc), domain: "perf", desc: "k"}
			})
			require.NoError(t, err)
			return ds, done
		}
	}
	rlsCheck := func(t *testing.T, addr string) (decider, func()) {
		ds, done, err := grpcDeciders(addr, 1, 1, func(cc *grpc.ClientConn) decider {
			return rlsDecider{c: rlsv3.NewRateLimitServiceClient(cc), domain: "perf", desc: "check"}
		})
		require.NoError(t, err)
		return ds[0], done
	}

	for _, store := range []string{"memory", "redis"} {
		t.Run("sluice-"+store, func(t *testing.T) {
			st := store
			if store == "redis" {
				st = rds.URL()
			}
			httpAddr, grpcAddr := freeAddr(t), freeAddr(t)
			// HTTP /allow keys match no rule (they are looked up in the
			// domain "http"), so they take -rate and -burst, and the key
			// "check" its -limits: the same limits as the rules.
			c := startChild(t, "sluice-"+store, sluice, []string{"serve", "-addr", httpAddr, "-grpc", grpcAddr,
				"-config", rules, "-store", st, "-rate", "1000", "-burst", "1000", "-limits", "check=5:5"}, nil)
			c.waitHealthy(t, "http://"+httpAddr+"/healthz")
			check, done := rlsCheck(t, grpcAddr)
			defer done()
			measure(t, &serviceRow{server: "sluice serve -grpc -config", api: "gRPC ShouldRateLimit", store: store},
				rlsDeciders(t, grpcAddr), check)
			measure(t, &serviceRow{server: "sluice serve", api: "HTTP /allow", store: store, http: true},
				func(workers int) ([]decider, func()) { return httpDeciders(httpAddr, workers) },
				&fixedKeyDecider{d: &httpDecider{addr: httpAddr}, key: "check"})
		})
	}

	t.Run("envoyproxy-ratelimit", func(t *testing.T) {
		httpAddr, grpcAddr, debugAddr := freeAddr(t), freeAddr(t), freeAddr(t)
		host := func(a string) string { h, _, _ := net.SplitHostPort(a); return h }
		port := func(a string) string { _, p, _ := net.SplitHostPort(a); return p }
		// Its defaults otherwise (no pipelining, no local cache); statsd off,
		// as there is no statsd here.
		c := startChild(t, "envoyproxy-ratelimit", envoyRL, nil, []string{
			"HOST=" + host(httpAddr), "PORT=" + port(httpAddr),
			"GRPC_HOST=" + host(grpcAddr), "GRPC_PORT=" + port(grpcAddr),
			"DEBUG_HOST=" + host(debugAddr), "DEBUG_PORT=" + port(debugAddr),
			"USE_STATSD=false", "LOG_LEVEL=warn",
			"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + rds.Addr(),
			"RUNTIME_ROOT=" + filepath.Join(work, "runtime"), "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		})
		c.waitHealthy(t, "http://"+httpAddr+"/healthcheck")
		check, done := rlsCheck(t, grpcAddr)
		defer done()
		measure(t, &serviceRow{server: "envoyproxy/ratelimit", api: "gRPC ShouldRateLimit", store: "redis"},
			rlsDeciders(t, grpcAddr), check)
	})

	t.Run("gubernator", func(t *testing.T) {
		httpAddr, grpcAddr, memberAddr := freeAddr(t), freeAddr(t), freeAddr(t)
		// One node: member-list discovery on loopback, knowing only itself;
		// no trace exporter (its default sends OTLP to localhost).
		c := startChild(t, "gubernator", gubernator, nil, []string{
			"GUBER_GRPC_ADDRESS=" + grpcAddr, "GUBER_HTTP_ADDRESS=" + httpAddr, "GUBER_ADVERTISE_ADDRESS=" + grpcAddr,
			"GUBER_PEER_DISCOVERY_TYPE=member-list", "GUBER_MEMBERLIST_ADDRESS=" + memberAddr,
			"GUBER_MEMBERLIST_BIND_ADDRESS=" + memberAddr, "GUBER_MEMBERLIST_KNOWN_NODES=" + memberAddr,
			"GUBER_LOG_LEVEL=warn", "OTEL_TRACES_EXPORTER=none",
		})
		c.waitHealthy(t, "http://"+httpAddr+"/v1/HealthCheck")
		newDeciders := func(limit int64) func(int) ([]decider, func()) {
			return func(workers int) ([]decider, func()) {
				ds, done, err := grpcDeciders(grpcAddr, grpcConns, workers, func(cc *grpc.ClientConn) decider {
					return gubernatorDecider{cc: cc, limit: limit}
				})
				require.NoError(t, err)
				return ds, done
			}
		}
		checks, done := newDeciders(5)(1)
		defer done()
		measure(t, &serviceRow{server: "gubernator " + gubernatorVersion, api: "gRPC GetRateLimits", store: "memory"},
			newDeciders(1000), checks[0])
	})

	t.Logf("load average after: %s", loadAverage())
	fmt.Print(serviceTable(rows, secs))
}

// serviceRow is one server, API and store, and what its runs measured.
type serviceRow struct {
	server, api, store string
	http               bool
	peak, open         *loadResult
}

func (r *serviceRow) name() string { return r.server + ", " + r.api + ", " + r.store }

// serviceTable is the rows as a markdown table, then the same-run ratios.
func serviceTable(rows []*serviceRow, secs int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nclosed loop: %d calls in flight; open loop: %d calls/s from %d workers; %d s each; %d keys\n\n",
		peakWorkers, openRate, openWorkers, secs, keyCount)
	b.WriteString("| server | API | store | peak, decisions/s | 5000/s: p50 | p99 | sent late |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %.1f%% |\n", r.server, r.api, r.store,
			thousands(r.peak.decisionsPerSec()), millis(r.open.quantile(0.5)), millis(r.open.quantile(0.99)),
			100*r.open.lateShare())
	}
	find := func(server, api, store string) *serviceRow {
		for _, r := range rows {
			if strings.HasPrefix(r.server, server) && strings.HasPrefix(r.api, api) && r.store == store {
				return r
			}
		}
		return nil
	}
	ratios := []struct {
		what     string
		num, den *serviceRow
	}{
		{"sluice gRPC, redis ÷ envoyproxy/ratelimit (redis)",
			find("sluice serve -grpc", "gRPC", "redis"), find("envoyproxy/ratelimit", "gRPC", "redis")},
		{"sluice gRPC, memory ÷ envoyproxy/ratelimit (redis)",
			find("sluice serve -grpc", "gRPC", "memory"), find("envoyproxy/ratelimit", "gRPC", "redis")},
		{"sluice gRPC, memory ÷ gubernator (memory)",
			find("sluice serve -grpc", "gRPC", "memory"), find("gubernator", "gRPC", "memory")},
		{"sluice HTTP, redis ÷ HTTP, memory",
			find("sluice serve", "HTTP", "redis"), find("sluice serve", "HTTP", "memory")},
	}
	b.WriteString("\n| same run, peak decisions/s | ratio |\n|---|---|\n")
	for _, r := range ratios {
		v := "-"
		if r.num != nil && r.den != nil {
			v = fmt.Sprintf("%.2f", r.num.peak.decisionsPerSec()/r.den.peak.decisionsPerSec())
		}
		fmt.Fprintf(&b, "| %s | %s |\n", r.what, v)
	}
	return b.String()
}

func thousands(v float64) string {
	s := strconv.FormatInt(int64(v+0.5), 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func millis(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	if ms >= 10 {
		return fmt.Sprintf("%.1f ms", ms)
	}
	return fmt.Sprintf("%.2f ms", ms)
}

// fixedKeyDecider asks d about key whatever key it is given.
type fixedKeyDecider struct {
	d   *httpDecider
	key string
}

func (f *fixedKeyDecider) decide(ctx context.Context, _ string) (bool, error) {
	return f.d.decide(ctx, f.key)
}

// requireDecides checks that the server decides: once it answers at all
// (retried for a while: a server can answer its health check before its
// limiter is ready), 20 calls at once on a fresh key limited to 5 a second
// must give 5 to 10 allows (10 if a fixed window rolls over among them) and
// the rest denials. A server or config that allows everything cannot score.
func requireDecides(t *testing.T, name string, check decider, newDeciders func(int) ([]decider, func())) {
	t.Helper()
	ds, done := newDeciders(1)
	defer done()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		_, err := ds[0].decide(ctx, "k0")
		if err == nil {
			break
		}
		// A real process: retried until it answers or the deadline passes.
		require.NoError(t, ctx.Err(), "%s does not answer: %v", name, err)
		time.Sleep(50 * time.Millisecond)
	}
	key := "check" + strconv.FormatInt(time.Now().UnixNano(), 36)
	allowed := 0
	for range 20 {
		ok, err := check.decide(ctx, key)
		require.NoError(t, err, name)
		if ok {
			allowed++
		}
	}
	if c, ok := check.(*fixedKeyDecider); ok {
		c.d.close()
	}
	t.Logf("%s: 20 calls on a key limited to 5/s gave %d allowed, %d denied", name, allowed, 20-allowed)
	assert.GreaterOrEqual(t, allowed, 5, name)
	require.LessOrEqual(t, allowed, 10, "%s: a limit of 5/s must deny", name)
}

// buildSluice builds ../cmd/sluice into dir and returns the binary's path.
func buildSluice(t *testing.T, dir string) string {
	t.Helper()
	src, err := filepath.Abs(filepath.Join("..", "cmd", "sluice"))
	require.NoError(t, err)
	bin := filepath.Join(dir, exeName("sluice"))
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = src
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build ./cmd/sluice: %s", out)
	return bin
}

// peerBinary returns the path of the peer's binary name: from
// SLUICE_PEERS_BIN when set, else from the cache directory
// sluice-bench/VERSION, installed there with `go install PKG@VERSION` when
// it is missing.
func peerBinary(t *testing.T, name, pkg, version string) string {
	t.Helper()
	if dir := os.Getenv("SLUICE_PEERS_BIN"); dir != "" {
		bin := filepath.Join(dir, exeName(name))
		require.FileExists(t, bin, "SLUICE_PEERS_BIN")
		return bin
	}
	cache, err := os.UserCacheDir()
	require.NoError(t, err)
	dir := filepath.Join(cache, "sluice-bench", version)
	bin := filepath.Join(dir, exeName(name))
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	t.Logf("go install %s@%s (once; kept in %s)", pkg, version, dir)
	cmd := exec.Command("go", "install", pkg+"@"+version)
	// Outside this workspace: the peer's own go.mod decides its dependencies.
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOWORK=off")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go install %s@%s: %s", pkg, version, out)
	return bin
}

func exeName(name string) string {
	if runtime.GOOS == "windows" {
		return name + ".exe"
	}
	return name
}

// freeAddr is a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// child is a server process started for the test, in a process group of
// its own, killed with its group at the test's cleanup. Its output goes to
// a file, shown when it does not come up.
type child struct {
	name, log string
	cmd       *exec.Cmd
}

func startChild(t *testing.T, name, bin string, args, env []string) *child {
	t.Helper()
	c := &child{name: name, log: filepath.Join(t.TempDir(), name+".log")}
	f, err := os.Create(c.log)
	require.NoError(t, err)
	c.cmd = exec.Command(bin, args...)
	c.cmd.Env = append(os.Environ(), env...)
	c.cmd.Stdout, c.cmd.Stderr = f, f
	ownGroup(c.cmd)
	err = c.cmd.Start()
	_ = f.Close() // the child has its own copy
	require.NoError(t, err, name)
	t.Cleanup(func() {
		killGroup(c.cmd)
		_ = c.cmd.Wait()
	})
	return c
}

// waitHealthy polls url until it answers 200, for 60 s at most (the peers
// take a while to start on a loaded machine).
func (c *child) waitHealthy(t *testing.T, url string) {
	t.Helper()
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := hc.Get(url)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(c.log)
			t.Fatalf("%s: no 200 from %s within 60 s (last: %v); its output:\n%s", c.name, url, err, out)
		}
		// A real process: polled until it is up or the deadline passes.
		time.Sleep(20 * time.Millisecond)
	}
}

// loadAverage is /proc/loadavg's first three fields, where there is one.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}
