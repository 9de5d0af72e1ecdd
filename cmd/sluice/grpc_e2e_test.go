package main_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-go/sluice/internal/redistest"
)

var grpcListenRE = regexp.MustCompile(`msg="grpc listening" addr=(\S+)`)

// rlsClient dials the gRPC address a serve child logged.
func rlsClient(t *testing.T, s *server) rlsv3.RateLimitServiceClient {
	t.Helper()
	m := grpcListenRE.FindStringSubmatch(s.logs.String())
	require.NotNil(t, m, "no grpc listening line:\n%s", s.logs.String())
	conn, err := grpc.NewClient(m[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

func writeRules(t *testing.T, path, yaml string) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(yaml), 0o600))
}

func shouldRateLimit(t *testing.T, c rlsv3.RateLimitServiceClient, domain string, kv ...string) *rlsv3.RateLimitResponse {
	t.Helper()
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
	require.NoError(t, err)
	return r
}

const e2eRules = `
domain: api
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 3
`

func TestServeBadConfigExit2(t *testing.T) {
	file := filepath.Join(t.TempDir(), "ratelimit.yaml")
	writeRules(t, file, "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minutes\n      requests_per_unit: 3\n")
	out, err := exec.Command(binary, "serve", "-addr", "127.0.0.1:0", "-grpc", "127.0.0.1:0", "-config", file).CombinedOutput()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "%s", out)
	assert.Equal(t, 2, ee.ExitCode())
	assert.Contains(t, string(out), file+`:5: descriptors[0].rate_limit.unit: "minutes" is not a unit`)

	frac := filepath.Join(t.TempDir(), "frac.yaml")
	writeRules(t, frac, "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 0.9}\n")
	big := filepath.Join(t.TempDir(), "big.yaml")
	writeRules(t, big, e2eRules+strings.Repeat("#"+strings.Repeat(" ", 1022)+"\n", 8<<10))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-config", frac}, frac + `:4: descriptors[0].rate_limit.requests_per_unit: "0.9" is not a whole number`},
		{[]string{"-config", big}, big + ": file is over the 8 MiB maximum"},
		{[]string{"-config", filepath.Join(t.TempDir(), "none.yaml")}, "no such file"},
		{[]string{"-config-poll", "1s"}, "-config-poll needs -config"},
		{[]string{"-config", file, "-config-poll", "-1s"}, "must not be negative"},
	} {
		out, err = exec.Command(binary, append([]string{"serve", "-addr", "127.0.0.1:0"}, c.args...)...).CombinedOutput()
		require.ErrorAs(t, err, &ee, "%s", out)
		assert.Equal(t, 2, ee.ExitCode(), "%v", c.args)
		assert.Contains(t, string(out), c.want)
	}
}

// SIGHUP reloads the rules; a bad file keeps the old ones, logged and counted.
func TestServeReloadOnSIGHUP(t *testing.T) {
	file := filepath.Join(t.TempDir(), "ratelimit.yaml")
	writeRules(t, file, e2eRules)
	s := serve(t, "-store", "memory", "-grpc", "127.0.0.1:0", "-config", file)
	assert.Contains(t, s.logs.String(), `msg="rules loaded" file=`+file+` domains=api rules=1`)
	c := rlsClient(t, s)
	gm := grpcListenRE.FindStringSubmatch(s.logs.String())
	hc, err := grpc.NewClient(gm[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer hc.Close()
	h, err := healthpb.NewHealthClient(hc).Check(context.Background(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, h.Status)
	for i := range 3 {
		r := shouldRateLimit(t, c, "api", "user", "ann")
		require.Equal(t, rlsv3.RateLimitResponse_OK, r.OverallCode, "request %d", i+1)
	}
	assert.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, shouldRateLimit(t, c, "api", "user", "ann").OverallCode)

	reload := func(wantLog string, n int) {
		t.Helper()
		require.NoError(t, s.cmd.Process.Signal(syscall.SIGHUP))
		// A real process: wait for the line that says the reload happened.
		require.Eventually(t, func() bool { return strings.Count(s.logs.String(), wantLog) == n },
			10*time.Second, 5*time.Millisecond, "%s", s.logs.String())
	}
	// Same "user" rule, a new "team" rule: ann's bucket stays empty.
	writeRules(t, file, e2eRules+"  - key: team\n    rate_limit: {unit: second, requests_per_unit: 7}\n")
	reload(`msg="rules reloaded"`, 1)
	assert.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, shouldRateLimit(t, c, "api", "user", "ann").OverallCode)
	r := shouldRateLimit(t, c, "api", "team", "red")
	assert.EqualValues(t, 6, r.Statuses[0].LimitRemaining)

	writeRules(t, file, "domain: api\ndescriptors:\n  - key: team\n    rate_limit: {unit: second, requests_per_unit: seven}\n")
	reload(`msg="rules reload failed; keeping the rules in force"`, 1)
	assert.Contains(t, s.logs.String(), file+`:4: descriptors[0].rate_limit.requests_per_unit`)
	r = shouldRateLimit(t, c, "api", "team", "red")
	assert.EqualValues(t, 5, r.Statuses[0].LimitRemaining, "the previous rules and bucket")
	m := get(t, s.URL+"/metrics").body
	assert.Contains(t, m, `sluice_config_reloads_total{result="error"} 1`)
	assert.Contains(t, m, `sluice_config_reloads_total{result="ok"} 1`)
	assert.Equal(t, 0, s.stop(t))
}

// -config-poll reloads when the file changes, without a signal.
func TestServeReloadOnFileChange(t *testing.T) {
	file := filepath.Join(t.TempDir(), "ratelimit.yaml")
	writeRules(t, file, e2eRules)
	s := serve(t, "-store", "memory", "-grpc", "127.0.0.1:0", "-config", file, "-config-poll", "10ms")
	c := rlsClient(t, s)
	assert.EqualValues(t, 2, shouldRateLimit(t, c, "api", "user", "cy").Statuses[0].LimitRemaining)
	writeRules(t, file, strings.Replace(e2eRules, "requests_per_unit: 3", "requests_per_unit: 30", 1))
	// A real process: wait for the line that says the reload happened.
	require.Eventually(t, func() bool { return strings.Contains(s.logs.String(), `msg="rules reloaded"`) },
		10*time.Second, 5*time.Millisecond, "%s", s.logs.String())
	assert.EqualValues(t, 29, shouldRateLimit(t, c, "api", "user", "cy").Statuses[0].LimitRemaining)
	assert.Equal(t, 1, strings.Count(s.logs.String(), `msg="rules reloaded"`), "one change, one reload")
	assert.Equal(t, 0, s.stop(t))
}

// Envoy's view of a store outage: descriptors follow -fail.
func TestServeGRPCRedisKilled(t *testing.T) {
	for _, mode := range []string{"open", "closed"} {
		t.Run(mode, func(t *testing.T) {
			rs := redistest.Start(t)
			file := filepath.Join(t.TempDir(), "ratelimit.yaml")
			writeRules(t, file, e2eRules)
			s := serve(t, "-store", rs.URL(), "-fail", mode, "-store-timeout", "5s", "-grpc", "127.0.0.1:0", "-config", file)
			c := rlsClient(t, s)
			r := shouldRateLimit(t, c, "api", "user", "bo")
			require.Equal(t, rlsv3.RateLimitResponse_OK, r.OverallCode)
			require.EqualValues(t, 2, r.Statuses[0].LimitRemaining)
			rs.Kill()
			r = shouldRateLimit(t, c, "api", "user", "bo")
			want := map[string]rlsv3.RateLimitResponse_Code{"open": rlsv3.RateLimitResponse_OK, "closed": rlsv3.RateLimitResponse_OVER_LIMIT}[mode]
			assert.Equal(t, want, r.OverallCode)
			assert.Equal(t, want, r.Statuses[0].Code)
			assert.Contains(t, get(t, s.URL+"/metrics").body, `sluice_store_errors_total{store="redis"} 1`)
			assert.Equal(t, 0, s.stop(t))
			assert.Contains(t, s.logs.String(), "store failing")
		})
	}
}

// Three replicas, each asking its own serve over gRPC, on one shm table: the
// sum allowed is held to rate·T + burst.
func TestThreeReplicasGRPC(t *testing.T) {
	dir := shmDir(t)
	file := filepath.Join(t.TempDir(), "ratelimit.yaml")
	writeRules(t, file, "domain: api\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 20}\n")
	clients := make([]rlsv3.RateLimitServiceClient, 3)
	for i := range clients {
		s := serve(t, "-store", "shm:"+dir, "-grpc", "127.0.0.1:0", "-config", file)
		clients[i] = rlsClient(t, s)
	}
	const d = 1500 * time.Millisecond
	var mu sync.Mutex
	allowed, attempts := 0, 0
	start := time.Now()
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Go(func() {
			tick := time.NewTicker(10 * time.Millisecond) // 100/s each: 15× the limit in all
			defer tick.Stop()
			for time.Since(start) < d {
				<-tick.C
				r := shouldRateLimit(t, c, "api", "tenant", "acme")
				mu.Lock()
				attempts++
				if r.OverallCode == rlsv3.RateLimitResponse_OK {
					allowed++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	bound := 20*elapsed.Seconds() + 20
	t.Logf("grpc over shm: allowed %d of %d over %v (bound %.1f)", allowed, attempts, elapsed, bound)
	assert.LessOrEqual(t, float64(allowed), bound)
	assert.GreaterOrEqual(t, allowed, 20, "demand far above the limit for ≥ 1.5 s: the burst at least (about 50 pass)")
	assert.Greater(t, attempts, allowed)
}
