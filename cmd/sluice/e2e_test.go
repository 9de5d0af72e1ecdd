package main_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/redistest"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sluice-e2e-")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "sluice")
	out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		_ = os.RemoveAll(dir)
		os.Exit(code)
	}))
}

// server is a running `sluice serve` child.
type server struct {
	cmd  *exec.Cmd
	URL  string
	logs *syncBuf
	done chan struct{}
}

type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

var listenRE = regexp.MustCompile(`msg=listening addr=(\S+)|"msg":"listening","addr":"([^"]+)"`)

// serve starts `sluice serve -addr 127.0.0.1:0 args...` and waits for its
// "listening" log line.
func serve(t *testing.T, args ...string) *server {
	t.Helper()
	return serveBinary(t, binary, args...)
}

// serveBinary is serve with the sluice binary at bin.
func serveBinary(t *testing.T, bin string, args ...string) *server {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"serve", "-addr", "127.0.0.1:0"}, args...)...)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	s := &server{cmd: cmd, logs: &syncBuf{}, done: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		defer close(s.done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			_, _ = s.logs.Write([]byte(line + "\n"))
			if m := listenRE.FindStringSubmatch(line); m != nil {
				addr <- m[1] + m[2]
			}
		}
	}()
	select {
	case a := <-addr:
		s.URL = "http://" + a
	case <-s.done:
		_ = cmd.Wait()
		t.Fatalf("serve exited before listening:\n%s", s.logs.String())
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("serve did not start:\n%s", s.logs.String())
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-s.done
			_ = cmd.Wait()
		}
	})
	return s
}

// stop sends SIGTERM and returns the exit code.
func (s *server) stop(t *testing.T) int {
	t.Helper()
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	<-s.done
	err := s.cmd.Wait()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	require.NoError(t, err)
	return 0
}

type resp struct {
	status int
	header http.Header
	body   string
}

var hc = &http.Client{Timeout: 5 * time.Second}

func get(t *testing.T, url string) resp {
	t.Helper()
	r, err := hc.Get(url)
	require.NoError(t, err)
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	require.NoError(t, err)
	return resp{r.StatusCode, r.Header, string(b)}
}

func TestServeEndToEnd(t *testing.T) {
	s := serve(t, "-store", "memory", "-rate", "10", "-burst", "10", "-limits", "tenant-b=5:5")
	var codes []int
	for range 12 {
		codes = append(codes, get(t, s.URL+"/allow?key=t").status)
	}
	assert.Equal(t, []int{200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 429, 429}, codes[:12])
	r := get(t, s.URL+"/allow?key=t")
	require.Equal(t, 429, r.status)
	assert.Equal(t, "1", r.header.Get("Retry-After"))
	assert.Equal(t, "10", r.header.Get("X-RateLimit-Limit"))
	assert.Equal(t, `"default";q=10;w=1;sluice-burst=10`, r.header.Get("RateLimit-Policy"))
	assert.Equal(t, `"default";r=0;t=1`, r.header.Get("RateLimit"))
	assert.Contains(t, r.body, `"allowed":false`)

	r = get(t, s.URL+"/allow?key=tenant-b&n=6")
	assert.Equal(t, 400, r.status)
	assert.Contains(t, r.body, "can never be allowed")

	var st map[string]int64
	require.NoError(t, json.Unmarshal([]byte(get(t, s.URL+"/stats").body), &st))
	assert.Equal(t, map[string]int64{"keys": 1, "allowed_total": 10, "denied_total": 3, "shadow_denied_total": 0,
		"degraded_total": 0, "canceled_total": 0}, st)
	assert.Equal(t, "ok\n", get(t, s.URL+"/healthz").body)
	assert.Contains(t, get(t, s.URL+"/metrics").body, `sluice_decisions_total{policy="default",result="allowed"} 10`)

	assert.Equal(t, 0, s.stop(t), "SIGTERM is a graceful exit")
	logs := s.logs.String()
	assert.Contains(t, logs, "msg=\"shutting down\"")
	assert.Contains(t, logs, "msg=stopped allowed_total=10 denied_total=3 shadow_denied_total=0 degraded_total=0")
}

func TestServeBadFlagsExit2(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-limits", "a=1:1,b=oops"}, `-limits entry 2 "b=oops"`},
		{[]string{"-fail", "maybe"}, `-fail: fail mode "maybe": want open or closed`},
		{[]string{"-rate", "0"}, "rate 0"},
		{[]string{"-store", "nope"}, `-store "nope"`},
		{[]string{"-max-overrides", "-1"}, "-max-overrides -1: must not be negative"},
	} {
		out, err := exec.Command(binary, append([]string{"serve", "-addr", "127.0.0.1:0"}, c.args...)...).CombinedOutput()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "%v: %s", c.args, out)
		assert.Equal(t, 2, ee.ExitCode(), "%v", c.args)
		assert.Contains(t, string(out), c.want)
	}
}

// Two serve processes on one shm directory hold one limit between them.
func TestTwoServeProcessesShareShm(t *testing.T) {
	dir := shmDir(t)
	a := serve(t, "-store", "shm:"+dir, "-rate", "0.001", "-burst", "20")
	b := serve(t, "-store", "shm:"+dir, "-rate", "0.001", "-burst", "20")
	allowed := 0
	for i := range 60 {
		s := a
		if i%2 == 1 {
			s = b
		}
		if get(t, s.URL+"/allow?key=shared").status == 200 {
			allowed++
		}
	}
	assert.Equal(t, 20, allowed, "60 requests alternating between two servers, burst 20 at 1 per 1000 s")
	assert.Equal(t, 0, a.stop(t))
	assert.Equal(t, 0, b.stop(t))
}

var summaryRE = regexp.MustCompile(`^(\S+) summary: attempts=(\d+) allowed=(\d+) denied=(\d+)(?: degraded=\d+)?(?: errors=(\d+))? → work done=(\d+)$`)

// runReplicas runs three `sluice client` processes at 20/s each for d against
// the given service URLs (round robin) and returns the total allowed and the
// wall time of the whole run.
func runReplicas(t *testing.T, urls []string, key string, d time.Duration) (int, time.Duration) {
	t.Helper()
	start := time.Now()
	outs := make([]string, 3)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			out, err := exec.Command(binary, "client", "-id", fmt.Sprintf("inst-%d", i+1), "-limiter", urls[i%len(urls)],
				"-key", key, "-rps", "20", "-duration", d.String(), "-timeout", "500ms", "-fail", "closed").CombinedOutput()
			assert.NoError(t, err, "%s", out)
			outs[i] = string(out)
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	total := 0
	for i, out := range outs {
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.GreaterOrEqual(t, len(lines), 2, out)
		// One progress row per second, then the summary and latency lines.
		progress := lines[:len(lines)-2]
		assert.GreaterOrEqual(t, len(progress), int(d/time.Second)-1, out)
		for _, p := range progress {
			assert.Regexp(t, `^inst-\d +\d+\.\ds  attempts=\d+ allowed=\d+ denied=\d+ degraded=0 errors=0$`, p)
		}
		lines = lines[len(lines)-2:]
		m := summaryRE.FindStringSubmatch(lines[0])
		require.NotNil(t, m, "summary line %q", lines[0])
		assert.Equal(t, fmt.Sprintf("inst-%d", i+1), m[1])
		assert.Empty(t, m[5], "no errors: %s", out)
		n, _ := strconv.Atoi(m[3])
		total += n
		assert.Regexp(t, `^inst-\d /allow latency: p50=\S+ p99=\S+ `, lines[1])
	}
	return total, elapsed
}

func TestThreeReplicasShm(t *testing.T) {
	dir := shmDir(t)
	// Two servers on one shm table: replicas 1 and 3 use a, replica 2 uses b.
	a := serve(t, "-store", "shm:"+dir, "-limits", "tenant-a=10:10")
	b := serve(t, "-store", "shm:"+dir, "-limits", "tenant-a=10:10")
	total, elapsed := runReplicas(t, []string{a.URL, b.URL}, "tenant-a", 2*time.Second)
	bound := 10*elapsed.Seconds() + 10
	t.Logf("shm: allowed %d over %v (bound %.1f)", total, elapsed, bound)
	assert.LessOrEqual(t, float64(total), bound)
	assert.GreaterOrEqual(t, total, 20, "demand is 6× the limit over ≥ 2 s: about 30 pass")
}

func TestThreeReplicasRedis(t *testing.T) {
	rs := redistest.Start(t)
	s := serve(t, "-store", rs.URL(), "-limits", "tenant-a=10:10")
	total, elapsed := runReplicas(t, []string{s.URL}, "tenant-a", 2*time.Second)
	bound := 10*elapsed.Seconds() + 10
	t.Logf("redis: allowed %d over %v (bound %.1f)", total, elapsed, bound)
	assert.LessOrEqual(t, float64(total), bound)
	assert.GreaterOrEqual(t, total, 20, "demand is 6× the limit: about 30 pass")
}

func TestRedisKilledMidRun(t *testing.T) {
	for _, mode := range []string{"open", "closed"} {
		t.Run(mode, func(t *testing.T) {
			rs := redistest.Start(t)
			s := serve(t, "-store", rs.URL(), "-fail", mode, "-store-timeout", "200ms")
			require.Equal(t, 200, get(t, s.URL+"/allow?key=k").status)
			require.Equal(t, 200, get(t, s.URL+"/healthz").status)

			rs.Kill()
			r := get(t, s.URL+"/allow?key=k")
			if mode == "open" {
				assert.Equal(t, 200, r.status, r.body)
				assert.Contains(t, r.body, `"allowed":true`)
			} else {
				assert.Equal(t, 429, r.status, r.body)
				assert.Contains(t, r.body, `"allowed":false`)
			}
			assert.Contains(t, r.body, "store unavailable")
			h := get(t, s.URL+"/healthz")
			assert.Equal(t, 503, h.status)
			assert.Contains(t, h.body, "store down (redis)")
			assert.Contains(t, get(t, s.URL+"/metrics").body, `sluice_store_errors_total{store="redis"} 1`)

			rs.Restart()
			// go-redis redials on the next call; a real process, so poll.
			require.Eventually(t, func() bool { return get(t, s.URL+"/healthz").status == 200 },
				10*time.Second, 20*time.Millisecond)
			r = get(t, s.URL+"/allow?key=k")
			assert.Equal(t, 200, r.status, r.body)
			assert.NotContains(t, r.body, "degraded")
			assert.Equal(t, 0, s.stop(t))
			assert.Contains(t, s.logs.String(), "store failing")
			assert.Contains(t, s.logs.String(), "store recovered")
		})
	}
}

// -store-timeout bounds each decision as its caller sees it when Redis
// accepts connections and never answers: concurrent requests (some queued
// behind another's round trip) each get the fail mode's answer within the
// bound, not after the client's read timeout and then their own.
func TestSilentRedisAnswersWithinStoreTimeout(t *testing.T) {
	const bound = 300 * time.Millisecond
	for _, mode := range []string{"open", "closed"} {
		t.Run(mode, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			var wg sync.WaitGroup
			var mu sync.Mutex
			var conns []net.Conn
			wg.Go(func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					mu.Lock()
					conns = append(conns, c)
					mu.Unlock()
					wg.Go(func() { _, _ = io.Copy(io.Discard, c) }) // reads, never answers
				}
			})
			t.Cleanup(func() {
				_ = ln.Close()
				mu.Lock()
				for _, c := range conns {
					_ = c.Close()
				}
				mu.Unlock()
				wg.Wait()
			})
			s := serve(t, "-store", "redis://"+ln.Addr().String()+"/0", "-fail", mode, "-store-timeout", bound.String())
			want := map[string]int{"open": 200, "closed": 429}[mode]
			const n = 8
			var reqs sync.WaitGroup
			for range n {
				reqs.Go(func() {
					start := time.Now()
					r := get(t, s.URL+"/allow?key=k")
					took := time.Since(start)
					assert.Equal(t, want, r.status, r.body)
					assert.Contains(t, r.body, "store unavailable")
					assert.Less(t, took, bound+bound/2, "within -store-timeout")
				})
			}
			reqs.Wait()
			assert.Equal(t, 0, s.stop(t))
		})
	}
}

func TestDemoFinishesAndHoldsTheLimit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(ctx, binary, "demo", "-duration", "2s").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Less(t, time.Since(start), 6*time.Second)
	s := string(out)
	assert.Regexp(t, `allowed in total: \d+ of \d+ attempts`, s)
	assert.Regexp(t, `→  \d+ ≤ \d+\.\d`, s)
	assert.Equal(t, 3, strings.Count(s, " summary: attempts="))
}

// shmDir returns a fresh directory on tmpfs (/dev/shm) when there is one,
// where shm tables belong (on a disk filesystem page writeback can stall
// them), else t.TempDir().
func shmDir(t *testing.T) string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "sluice-test-"); err == nil {
			t.Cleanup(func() { _ = os.RemoveAll(d) })
			return d
		}
	}
	return t.TempDir()
}

// A second serve whose shm tables disagree with the live ones (another slot
// count) refuses to start, naming the mismatch, and leaves the first serving.
func TestServeShmMismatchRefusedAtStart(t *testing.T) {
	dir := shmDir(t)
	a := serve(t, "-store", "shm:"+dir, "-shm-slots", "1024")
	out, err := exec.Command(binary, "serve", "-addr", "127.0.0.1:0", "-store", "shm:"+dir, "-shm-slots", "2048").CombinedOutput()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "%s", out)
	assert.Equal(t, 1, ee.ExitCode())
	assert.Contains(t, string(out), "policy mismatch")
	assert.Equal(t, 200, get(t, a.URL+"/allow?key=k").status)
	assert.Equal(t, 0, a.stop(t))
}

// A lone serve restarted with more slots (what the eviction warning asks
// for) starts: the old tables nobody holds, their buckets all full, are
// replaced.
func TestServeShmMoreSlotsAfterRestart(t *testing.T) {
	dir := shmDir(t)
	a := serve(t, "-store", "shm:"+dir, "-shm-slots", "1024")
	assert.Equal(t, 0, a.stop(t))
	b := serve(t, "-store", "shm:"+dir, "-shm-slots", "2048")
	assert.Equal(t, 200, get(t, b.URL+"/allow?key=k").status)
	assert.Equal(t, 0, b.stop(t))
}

// While Redis is down, every decision follows -fail within milliseconds
// (the breaker answers at once; a probe checks Redis every 200 ms), the logs
// stay JSON, /healthz names the fault, and decisions come back from Redis
// within about one probe of its return, with no restart.
func TestRedisOutageCostsMilliseconds(t *testing.T) {
	rs := redistest.Start(t)
	s := serve(t, "-store", rs.URL(), "-fail", "closed", "-log", "json")
	require.Equal(t, 200, get(t, s.URL+"/allow?key=k").status)

	// The same-run baseline: the same load while Redis answers.
	const workers = 4
	up, _ := hammer(t, s.URL+"/allow?key=up", workers, time.Second)
	slices.Sort(up)
	t.Logf("Redis up (baseline): %d requests from %d workers, p50=%v p99=%v", len(up), workers, up[len(up)/2], up[len(up)*99/100])

	rs.Kill()
	lat, bodies := hammer(t, s.URL+"/allow?key=k", workers, time.Second)
	// The first few requests find the broken pooled connections or trip the
	// breaker; the rest are answered by the open breaker.
	lat = lat[min(len(lat), 3*workers):]
	slices.Sort(lat)
	p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
	t.Logf("Redis down: %d requests from %d workers, p50=%v p99=%v", len(lat), workers, p50, p99)
	assert.Less(t, p50, 5*time.Millisecond)
	assert.Less(t, p99, 50*time.Millisecond, "the 250 ms store timeout is never waited for")
	for b, n := range bodies {
		assert.Contains(t, b, `"allowed":false`, "%d× %s", n, b)
		assert.Contains(t, b, "failing closed")
	}
	h := get(t, s.URL+"/healthz")
	assert.Equal(t, 503, h.status)
	assert.Regexp(t, `^store down \(redis\): redisstore: dial tcp 127\.0\.0\.1:\d+: connect: connection refused; failing closed\n$`, h.body)

	rs.Restart()
	back := time.Now()
	for get(t, s.URL+"/allow?key=k").status != 200 {
		require.Less(t, time.Since(back), 5*time.Second, "decisions resume without a restart")
	}
	took := time.Since(back)
	t.Logf("Redis back: decisions from Redis again after %v", took)
	assert.Less(t, took, time.Second, "within about one 200 ms probe")
	assert.Equal(t, 200, get(t, s.URL+"/healthz").status)

	assert.Equal(t, 0, s.stop(t))
	logs := strings.TrimSpace(s.logs.String())
	for _, line := range strings.Split(logs, "\n") {
		assert.True(t, json.Valid([]byte(line)), "-log json: every line is JSON: %s", line)
	}
	assert.Contains(t, logs, `"msg":"store down: answering without it; probing"`)
	assert.Contains(t, logs, `"msg":"store back: breaker closed"`)
	assert.Regexp(t, `"msg":"stopped","allowed_total":\d+,"denied_total":\d+,"shadow_denied_total":0,"degraded_total":\d+,"fail_open":false`, logs)
}

// hammer sends GETs to url from workers goroutines for d and returns each
// request's latency and the distinct bodies with their counts.
func hammer(t *testing.T, url string, workers int, d time.Duration) ([]time.Duration, map[string]int) {
	var mu sync.Mutex
	var lat []time.Duration
	bodies := map[string]int{}
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for time.Now().Before(end) {
				start := time.Now()
				r, err := hc.Get(url)
				if !assert.NoError(t, err) {
					return
				}
				b, _ := io.ReadAll(r.Body)
				_ = r.Body.Close()
				took := time.Since(start)
				mu.Lock()
				lat = append(lat, took)
				bodies[string(b)]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return lat, bodies
}
