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
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
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
	peakWorkers = 32 // closed loop: calls in flight
	// Open loop: workers sharing the schedule, enough that the loop's own
	// concurrency does not hold back a server answering in a few ms.
	openWorkers = 64
	openRate    = 5000 // open loop: calls a second (default)
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
// Every server runs from the start, idle but for the row being measured;
// each checks first that it decides, then the rounds run: in each, every
// row's peak (closed loop, 32 calls in flight), then every row's open loop
// (5000 calls/s from 64 workers), so a drift in the machine's load hits
// every row alike. A row's figures pool its rounds. The load is 1000 keys
// that never reach their limit, so every decision must be an allow and any
// error or denial fails the test. SLUICE_PEERS_SECS (default 10) is each
// run's measured time, after a second's warm-up; SLUICE_PEERS_ROUNDS
// (default 2) the rounds; SLUICE_PEERS_RATE (default 5000) the open loop's
// calls a second.
//
// On Linux the table also gives, over the peak runs, the CPU time per
// decision of the server, of redis-server (INFO cpu; for the rows that use
// it) and of this process (the load): steadier than decisions/s when the
// machine's cores are shared, and the server's and Redis's part free of the
// load generator's, which costs more per call over gRPC than over HTTP.
func TestServiceVsPeers(t *testing.T) {
	if os.Getenv("SLUICE_PEERS") == "" {
		t.Skip("set SLUICE_PEERS=1 to run (builds sluice and installs envoyproxy/ratelimit and gubernator, starts redis-server; takes minutes)")
	}
	secs := envInt(t, "SLUICE_PEERS_SECS", 10)
	rounds := envInt(t, "SLUICE_PEERS_ROUNDS", 2)
	rate := envInt(t, "SLUICE_PEERS_RATE", openRate)
	keys := make([]string, keyCount)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	peak := loadShape{warmup: time.Second, duration: time.Duration(secs) * time.Second, keys: keys}
	open := peak
	open.rate = float64(rate)

	rds := redistest.Start(t)
	raw := redis.NewClient(&redis.Options{Addr: rds.Addr()}) // INFO cpu
	defer raw.Close()
	work := t.TempDir()
	sluice := buildSluice(t, work)
	envoyRL := peerBinary(t, "service_cmd", envoyRatelimitPkg, envoyRatelimitVersion)
	gubernator := peerBinary(t, "gubernator", gubernatorPkg, gubernatorVersion)
	// envoyproxy/ratelimit reads RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config/*.yaml.
	rulesDir := filepath.Join(work, "runtime", "ratelimit", "config")
	require.NoError(t, os.MkdirAll(rulesDir, 0o755))
	rules := filepath.Join(rulesDir, "perf.yaml")
	require.NoError(t, os.WriteFile(rules, []byte(peersRules), 0o644))

	var rows []*serviceRow
	grpcRow := func(row *serviceRow, addr string, mk func(cc *grpc.ClientConn, check bool) decider) {
		row.newDeciders = func(workers int) ([]decider, func()) {
			ds, done, err := grpcDeciders(addr, grpcConns, workers, func(cc *grpc.ClientConn) decider { return mk(cc, false) })
			require.NoError(t, err)
			return ds, done
		}
		ds, done, err := grpcDeciders(addr, 1, 1, func(cc *grpc.ClientConn) decider { return mk(cc, true) })
		require.NoError(t, err)
		t.Cleanup(done)
		row.check = ds[0]
		rows = append(rows, row)
	}
	rls := func(cc *grpc.ClientConn, check bool) decider {
		d := rlsDecider{c: rlsv3.NewRateLimitServiceClient(cc), domain: "perf", desc: "k"}
		if check {
			d.desc = "check"
		}
		return d
	}
	for _, store := range []string{"memory", "redis"} {
		st := store
		if store == "redis" {
			st = rds.URL()
		}
		httpAddr, grpcAddr := freeAddr(t), freeAddr(t)
		// HTTP /allow keys match no rule (they are looked up in the domain
		// "http"), so they take -rate and -burst, and the key "check" its
		// -limits: the same limits as the rules.
		c := startChild(t, "sluice-"+store, sluice, []string{"serve", "-addr", httpAddr, "-grpc", grpcAddr,
			"-config", rules, "-store", st, "-rate", "1000", "-burst", "1000", "-limits", "check=5:5"}, nil)
		c.waitHealthy(t, "http://"+httpAddr+"/healthz")
		pid := c.cmd.Process.Pid
		grpcRow(&serviceRow{server: "sluice serve -grpc -config", api: "gRPC ShouldRateLimit", store: store,
			pid: pid, redis: store == "redis"}, grpcAddr, rls)
		rows = append(rows, &serviceRow{server: "sluice serve", api: "HTTP /allow", store: store,
			pid: pid, redis: store == "redis",
			newDeciders: func(workers int) ([]decider, func()) { return httpDeciders(httpAddr, workers) },
			check:       &fixedKeyDecider{d: &httpDecider{addr: httpAddr}, key: "check"}})
	}

	{
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
		grpcRow(&serviceRow{server: "envoyproxy/ratelimit", api: "gRPC ShouldRateLimit", store: "redis",
			pid: c.cmd.Process.Pid, redis: true}, grpcAddr, rls)
	}

	{
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
		// Each request names its limit (gubernator's API): the rules' 1000/s
		// for the load, 5/s for the check.
		grpcRow(&serviceRow{server: "gubernator " + gubernatorVersion, api: "gRPC GetRateLimits", store: "memory",
			pid: c.cmd.Process.Pid}, grpcAddr,
			func(cc *grpc.ClientConn, check bool) decider {
				if check {
					return gubernatorDecider{cc: cc, limit: 5}
				}
				return gubernatorDecider{cc: cc, limit: 1000}
			})
	}

	for _, row := range rows {
		requireDecides(t, row)
	}
	t.Logf("load average before the rounds: %s", loadAverage())
	for round := 1; round <= rounds; round++ {
		for _, run := range []struct {
			name    string
			shape   loadShape
			workers int
		}{{"peak", peak, peakWorkers}, {strconv.Itoa(rate) + "/s", open, openWorkers}} {
			for _, row := range rows {
				ds, done := row.newDeciders(run.workers)
				server0, redis0, load0 := processCPU(row.pid), redisCPU(t, raw), cpuTime()
				r := runLoad(ds, run.shape)
				cpuServer, cpuRedis, cpuLoad := processCPU(row.pid)-server0, redisCPU(t, raw)-redis0, cpuTime()-load0
				done()
				t.Logf("round %d, %s, %s: %.0f decisions/s, p50 %v, p99 %v, sent late %.1f%%; allowed %d, denied %d, errors %d; CPU per call: server %v, redis-server %v, load %v; load average %s",
					round, row.name(), run.name, r.decisionsPerSec(), r.quantile(0.5), r.quantile(0.99), 100*r.lateShare(),
					r.allowed, r.denied, r.bad, perCall(cpuServer, r.calls), perCall(cpuRedis, r.calls), perCall(cpuLoad, r.calls), loadAverage())
				if run.shape.rate == 0 { // an open loop that fell behind may have sent nothing in time: its row says so
					require.NotZero(t, r.allowed, "%s: no decisions", row.name())
				}
				require.Zero(t, r.bad, "%s: errors, the first: %v", row.name(), r.firstErr)
				require.Zero(t, r.denied, "%s: denials, but every key stays under its limit", row.name())
				if run.shape.rate > 0 {
					row.open.add(r)
				} else {
					row.peak.add(r)
					row.serverCPU += cpuServer
					if row.redis {
						row.redisCPU += cpuRedis
					}
					row.loadCPU += cpuLoad
				}
			}
		}
	}
	for _, row := range rows {
		slices.Sort(row.peak.lat)
		slices.Sort(row.open.lat)
	}
	fmt.Print(serviceTable(rows, secs, rounds, rate))
}

// serviceRow is one server, API and store: how to load it, how to check it
// decides, and what its rounds measured.
type serviceRow struct {
	server, api, store string
	newDeciders        func(workers int) ([]decider, func())
	check              decider // asks about a key limited to 5/s
	pid                int     // the server's process
	redis              bool    // whether it keeps its state in the redis-server
	peak, open         loadResult
	// CPU time over the peak runs (warm-up included, as peak.calls is) of
	// the server, of redis-server, and of this process (the load).
	serverCPU, redisCPU, loadCPU time.Duration
}

// perCall is cpu spread over calls, or 0 when either is unknown.
func perCall(cpu time.Duration, calls int) time.Duration {
	if cpu <= 0 || calls <= 0 {
		return 0
	}
	return cpu / time.Duration(calls)
}

func (r *serviceRow) name() string { return r.server + ", " + r.api + ", " + r.store }

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	require.NoError(t, err, name)
	require.Positive(t, n, name)
	return n
}

// serviceTable is the rows as a markdown table, then the same-run ratios.
func serviceTable(rows []*serviceRow, secs, rounds, rate int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n%d keys; peak: closed loop, %d calls in flight; %d/s: open loop, %d workers, latency from each call's intended send time; %d round(s) of %d s per run\n\n",
		keyCount, peakWorkers, rate, openWorkers, rounds, secs)
	fmt.Fprintf(&b, "| server | API | store | peak, decisions/s | server CPU / decision | redis-server CPU / decision | load CPU / decision | %d/s: p50 | p99 | sent late |\n", rate)
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %.1f%% |\n", r.server, r.api, r.store,
			thousands(r.peak.decisionsPerSec()), micros(perCall(r.serverCPU, r.peak.calls)),
			micros(perCall(r.redisCPU, r.peak.calls)), micros(perCall(r.loadCPU, r.peak.calls)),
			millis(r.open.quantile(0.5)), millis(r.open.quantile(0.99)),
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
	// Server and redis-server CPU per decision together: what a decision
	// costs the machine, apart from the load generator's share of it.
	cost := func(r *serviceRow) float64 { return float64(perCall(r.serverCPU+r.redisCPU, r.peak.calls)) }
	b.WriteString("\n| same run, peak | decisions/s ratio | server + redis-server CPU per decision ratio |\n|---|---|---|\n")
	for _, r := range ratios {
		v, c := "-", "-"
		if r.num != nil && r.den != nil {
			v = fmt.Sprintf("%.2f", r.num.peak.decisionsPerSec()/r.den.peak.decisionsPerSec())
			if cost(r.num) > 0 && cost(r.den) > 0 {
				c = fmt.Sprintf("%.2f", cost(r.num)/cost(r.den))
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", r.what, v, c)
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

func micros(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond))
}

func millis(d time.Duration) string {
	if d == 0 {
		return "-"
	}
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

// requireDecides checks that row's server decides: once it answers at all
// (retried for a while: a server can answer its health check before its
// limiter is ready), 20 calls in a row on a fresh key limited to 5 a second
// must give 5 to 10 allows (10 if a fixed window rolls over among them) and
// the rest denials. A server or config that allows everything cannot score.
func requireDecides(t *testing.T, row *serviceRow) {
	t.Helper()
	ds, done := row.newDeciders(1)
	defer done()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		_, err := ds[0].decide(ctx, "k0")
		if err == nil {
			break
		}
		require.NoError(t, ctx.Err(), "%s does not answer: %v", row.name(), err)
		// A real process: retried until it answers or the deadline passes.
		time.Sleep(50 * time.Millisecond)
	}
	key := "check" + strconv.FormatInt(time.Now().UnixNano(), 36)
	allowed := 0
	for range 20 {
		ok, err := row.check.decide(ctx, key)
		require.NoError(t, err, row.name())
		if ok {
			allowed++
		}
	}
	if c, ok := row.check.(*fixedKeyDecider); ok {
		c.d.close()
	}
	t.Logf("%s: 20 calls on a key limited to 5/s gave %d allowed, %d denied", row.name(), allowed, 20-allowed)
	assert.GreaterOrEqual(t, allowed, 5, row.name())
	require.LessOrEqual(t, allowed, 10, "%s: a limit of 5/s must deny", row.name())
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
