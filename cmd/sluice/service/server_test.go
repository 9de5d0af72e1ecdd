package service_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type vclock struct {
	mu  sync.Mutex
	now time.Duration
}

func (c *vclock) Now() time.Duration      { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *vclock) Advance(d time.Duration) { c.mu.Lock(); c.now += d; c.mu.Unlock() }

type fixture struct {
	srv   *service.Server
	ts    *httptest.Server
	clock *vclock
	mem   *store.Memory
}

// newFixture serves a Server over real loopback HTTP, backed by a memory store
// on a hand-driven clock, default 10/s burst 10.
func newFixture(t *testing.T, mutate func(*service.Config)) *fixture {
	t.Helper()
	c := &vclock{now: time.Hour}
	mem := store.NewMemory(store.WithClock(c.Now))
	cfg := service.Config{Store: mem, Default: store.Policy{Rate: 10, Burst: 10}, Fail: store.FailOpen,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if mutate != nil {
		mutate(&cfg)
	}
	srv, err := service.New(cfg)
	require.NoError(t, err)
	ts := httptest.NewServer(srv)
	t.Cleanup(func() { ts.Close(); _ = mem.Close() })
	return &fixture{srv: srv, ts: ts, clock: c, mem: mem}
}

type reply struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

func (f *fixture) do(t *testing.T, method, path string, body io.Reader, ctype string) reply {
	t.Helper()
	req, err := http.NewRequest(method, f.ts.URL+path, body)
	require.NoError(t, err)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := f.ts.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	r := reply{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		require.NoError(t, json.Unmarshal(raw, &r.body), "body %s", raw)
	}
	return r
}

func (f *fixture) get(t *testing.T, path string) reply { return f.do(t, http.MethodGet, path, nil, "") }

func TestAllowThenDeny(t *testing.T) {
	f := newFixture(t, nil)
	r := f.get(t, "/allow?key=t")
	require.Equal(t, 200, r.status, r.raw)
	assert.JSONEq(t, `{"allowed":true,"remaining":9,"limit":10,"rate":10}`, r.raw)
	assert.Equal(t, "10", r.header.Get("X-RateLimit-Limit"))
	assert.Equal(t, "9", r.header.Get("X-RateLimit-Remaining"))
	assert.Equal(t, `"default";q=10;w=1;sluice-burst=10`, r.header.Get("RateLimit-Policy"))
	assert.Equal(t, `"default";r=9;t=1`, r.header.Get("RateLimit"))
	assert.Empty(t, r.header.Get("Retry-After"))

	for i := 2; i <= 10; i++ {
		require.Equal(t, 200, f.get(t, "/allow?key=t").status, "request %d", i)
	}
	r = f.get(t, "/allow?key=t")
	require.Equal(t, 429, r.status)
	assert.JSONEq(t, `{"allowed":false,"remaining":0,"limit":10,"rate":10,"retry_after_ms":100}`, r.raw)
	assert.Equal(t, "1", r.header.Get("Retry-After"), "100 ms rounds up to 1 s")
	assert.Equal(t, "0", r.header.Get("X-RateLimit-Remaining"))
	assert.Equal(t, `"default";r=0;t=1`, r.header.Get("RateLimit"))

	f.clock.Advance(30 * time.Millisecond)
	r = f.do(t, http.MethodPost, "/allow?key=t", nil, "")
	require.Equal(t, 429, r.status)
	assert.JSONEq(t, `{"allowed":false,"remaining":0.3,"limit":10,"rate":10,"retry_after_ms":70}`, r.raw)

	f.clock.Advance(70 * time.Millisecond)
	r = f.get(t, "/allow?key=t")
	assert.Equal(t, 200, r.status)

	st := f.get(t, "/stats")
	assert.JSONEq(t, `{"keys":1,"allowed_total":11,"denied_total":2,"shadow_denied_total":0,"degraded_total":0,"canceled_total":0}`, st.raw)
}

func TestRetryAfterRoundsUpWholeSeconds(t *testing.T) {
	f := newFixture(t, func(c *service.Config) {
		c.Limits = map[string]store.Policy{"slow": {Name: "slow", Rate: 0.4, Burst: 2}}
	})
	for range 2 {
		require.Equal(t, 200, f.get(t, "/allow?key=slow").status)
	}
	f.clock.Advance(time.Millisecond)
	r := f.get(t, "/allow?key=slow")
	require.Equal(t, 429, r.status)
	// T = 2.5 s; 1 ms later the next token is 2.499 s away: 3 s, never 2.
	assert.Equal(t, "3", r.header.Get("Retry-After"))
	assert.EqualValues(t, 2499, r.body["retry_after_ms"])
	// 0.4/s is 2 per 5 s. t is the wait for the next whole token (2.499 s),
	// rounded up like Retry-After; it said 5 (time until full) before.
	assert.Equal(t, `"slow";q=2;w=5;sluice-burst=2`, r.header.Get("RateLimit-Policy"))
	assert.Equal(t, `"slow";r=0;t=3`, r.header.Get("RateLimit"))
}

func TestCostN(t *testing.T) {
	f := newFixture(t, nil)
	r := f.get(t, "/allow?key=k&n=7")
	require.Equal(t, 200, r.status)
	assert.EqualValues(t, 3, r.body["remaining"])
	r = f.do(t, http.MethodPost, "/allow", strings.NewReader("key=k&n=4"), "application/x-www-form-urlencoded")
	require.Equal(t, 429, r.status, r.raw)
	assert.EqualValues(t, 100, r.body["retry_after_ms"])
	r = f.do(t, http.MethodPost, "/allow?n=3", strings.NewReader("key=k"), "application/x-www-form-urlencoded")
	require.Equal(t, 200, r.status, r.raw)
	assert.EqualValues(t, 0, r.body["remaining"])
}

func TestLimitsOverrideDefault(t *testing.T) {
	limits, err := service.ParseLimits("tenant-a=100:200,tenant-b=5:5")
	require.NoError(t, err)
	f := newFixture(t, func(c *service.Config) { c.Limits = limits })
	r := f.get(t, "/allow?key=tenant-a&n=150")
	require.Equal(t, 200, r.status)
	assert.JSONEq(t, `{"allowed":true,"remaining":50,"limit":200,"rate":100}`, r.raw)
	assert.Equal(t, `"tenant-a";q=100;w=1;sluice-burst=200`, r.header.Get("RateLimit-Policy"))
	r = f.get(t, "/allow?key=tenant-b&n=6")
	assert.Equal(t, 400, r.status, "6 is above tenant-b's burst of 5")
	r = f.get(t, "/allow?key=other&n=10")
	assert.Equal(t, 200, r.status)
}

// TestPolicyHeaderRateAboveBurst is the -limits fast=100:1 case: the policy
// field must not say q=1;w=1, which reads as 1 request a second.
func TestPolicyHeaderRateAboveBurst(t *testing.T) {
	limits, err := service.ParseLimits("fast=100:1,even=10:10,deep=5:50")
	require.NoError(t, err)
	f := newFixture(t, func(c *service.Config) { c.Limits = limits })
	for key, want := range map[string]string{
		"fast": `"fast";q=100;w=1;sluice-burst=1`,
		"even": `"even";q=10;w=1;sluice-burst=10`,
		"deep": `"deep";q=5;w=1;sluice-burst=50`,
	} {
		r := f.get(t, "/allow?key="+key)
		require.Equal(t, 200, r.status, r.raw)
		assert.Equal(t, want, r.header.Get("RateLimit-Policy"), key)
	}
}

func TestBadInputCountsNothing(t *testing.T) {
	f := newFixture(t, func(c *service.Config) { c.MaxBodyBytes = 64 })
	long := strings.Repeat("k", service.MaxKeyLen+1)
	cases := []struct {
		name, method, path, body, ctype string
		status                          int
		errHas                          string
	}{
		{"missing key", "GET", "/allow", "", "", 400, "missing key"},
		{"empty key", "GET", "/allow?key=", "", "", 400, "missing key"},
		{"key too long", "GET", "/allow?key=" + long, "", "", 400, "257 bytes"},
		{"n not integer", "GET", "/allow?key=a&n=abc", "", "", 400, `n="abc"`},
		{"n fractional", "GET", "/allow?key=a&n=1.5", "", "", 400, "not an integer"},
		{"n zero", "GET", "/allow?key=a&n=0", "", "", 400, "at least 1"},
		{"n negative", "GET", "/allow?key=a&n=-3", "", "", 400, "at least 1"},
		{"n empty", "GET", "/allow?key=a&n=", "", "", 400, "not an integer"},
		{"n above burst", "GET", "/allow?key=a&n=11", "", "", 400, "can never be allowed"},
		{"key twice", "GET", "/allow?key=a&key=b", "", "", 400, "more than once"},
		{"bad escape", "GET", "/allow?key=%zz", "", "", 400, `bad key value "%zz": invalid URL escape "%zz"`},
		{"method", "PUT", "/allow?key=a", "", "", 405, "PUT"},
		{"delete", "DELETE", "/allow?key=a", "", "", 405, "DELETE"},
		{"body too big", "POST", "/allow?key=a", strings.Repeat("x", 65), "application/x-www-form-urlencoded", 413, "64 bytes"},
		{"json body", "POST", "/allow", `{"key":"a"}`, "application/json", 415, "application/json"},
		{"key in query and body", "POST", "/allow?key=a", "key=b", "application/x-www-form-urlencoded", 400, "more than once"},
		{"stats post", "POST", "/stats", "", "", 405, "POST"},
		{"unknown path", "GET", "/nope", "", "", 404, "/nope"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var body io.Reader
			if c.body != "" {
				body = strings.NewReader(c.body)
			}
			r := f.do(t, c.method, c.path, body, c.ctype)
			require.Equal(t, c.status, r.status, r.raw)
			require.Contains(t, r.header.Get("Content-Type"), "application/json")
			assert.Contains(t, r.body["error"], c.errHas)
			if c.status == 405 {
				assert.NotEmpty(t, r.header.Get("Allow"))
			}
		})
	}
	// Nothing counted, nothing stored, and the server still serves.
	assert.JSONEq(t, `{"keys":0,"allowed_total":0,"denied_total":0,"shadow_denied_total":0,"degraded_total":0,"canceled_total":0}`,
		f.get(t, "/stats").raw)
	assert.Equal(t, 200, f.get(t, "/allow?key="+strings.Repeat("k", service.MaxKeyLen)).status)
	m := f.get(t, "/metrics").raw
	assert.Contains(t, m, `sluice_bad_requests_total{status="400"} 12`)
}

func TestEscapedKeys(t *testing.T) {
	f := newFixture(t, nil)
	q := url.Values{"key": {"a b&c=d/é"}}
	for range 10 {
		require.Equal(t, 200, f.get(t, "/allow?"+q.Encode()).status)
	}
	assert.Equal(t, 429, f.get(t, "/allow?key=a+b%26c%3Dd%2F%C3%A9").status, "the same key however it is escaped")
	assert.Equal(t, 200, f.get(t, "/allow?key=a+b").status, "a different key")
}

func TestShadowNeverDenies(t *testing.T) {
	f := newFixture(t, func(c *service.Config) { c.Shadow = true })
	for range 10 {
		require.Equal(t, 200, f.get(t, "/allow?key=s").status)
	}
	r := f.get(t, "/allow?key=s")
	require.Equal(t, 200, r.status)
	assert.JSONEq(t, `{"allowed":true,"remaining":0,"limit":10,"rate":10,"retry_after_ms":100,"shadow_denied":true}`, r.raw)
	assert.Empty(t, r.header.Get("Retry-After"))
	// Kept apart from real denials, in /stats as in /metrics.
	assert.JSONEq(t, `{"keys":1,"allowed_total":10,"denied_total":0,"shadow_denied_total":1,"degraded_total":0,"canceled_total":0}`,
		f.get(t, "/stats").raw)
	m := f.get(t, "/metrics").raw
	assert.Contains(t, m, `sluice_decisions_total{policy="default",result="shadow_denied"} 1`)
	assert.Contains(t, m, `sluice_decisions_total{policy="default",result="denied"} 0`)
	assert.Equal(t, service.Stats{Allowed: 10, ShadowDenied: 1}, f.srv.Stats())
}

// brokenStore fails every call while down is set.
type brokenStore struct {
	store.Store
	mu   sync.Mutex
	down bool
}

var errDown = errors.New("connection refused")

func (b *brokenStore) set(down bool) { b.mu.Lock(); b.down = down; b.mu.Unlock() }
func (b *brokenStore) isDown() bool  { b.mu.Lock(); defer b.mu.Unlock(); return b.down }
func (b *brokenStore) Allow(ctx context.Context, k string, n int64, p store.Policy) (store.Result, error) {
	if b.isDown() {
		return store.Result{}, errDown
	}
	return b.Store.Allow(ctx, k, n, p)
}
func (b *brokenStore) Ping(ctx context.Context) error {
	if b.isDown() {
		return errDown
	}
	return b.Store.Ping(ctx)
}
func (b *brokenStore) Keys(ctx context.Context) (int64, error) {
	if b.isDown() {
		return 0, errDown
	}
	return b.Store.Keys(ctx)
}

// failMode is the FailMode of a -fail flag that says open or not.
func failMode(open bool) store.FailMode {
	if open {
		return store.FailOpen
	}
	return store.FailClosed
}

func TestStoreFailure(t *testing.T) {
	for _, open := range []bool{true, false} {
		t.Run(fmt.Sprintf("failOpen=%v", open), func(t *testing.T) {
			var bs *brokenStore
			f := newFixture(t, func(c *service.Config) {
				bs = &brokenStore{Store: c.Store}
				c.Store, c.Fail = bs, failMode(open)
			})
			require.Equal(t, "ok\n", f.get(t, "/healthz").raw)
			bs.set(true)
			r := f.get(t, "/allow?key=x")
			if open {
				require.Equal(t, 200, r.status, r.raw)
				assert.Equal(t, true, r.body["allowed"])
			} else {
				require.Equal(t, 429, r.status, r.raw)
				assert.Equal(t, false, r.body["allowed"])
				assert.Equal(t, "1", r.header.Get("Retry-After"))
				assert.Equal(t, `"default";r=0;t=1`, r.header.Get("RateLimit"))
			}
			// Degraded answers carry the policy too (they carried none before).
			assert.Equal(t, `"default";q=10;w=1;sluice-burst=10`, r.header.Get("RateLimit-Policy"))
			assert.Equal(t, "10", r.header.Get("X-RateLimit-Limit"))
			assert.Contains(t, r.body["degraded"], "store unavailable")
			h := f.get(t, "/healthz")
			assert.Equal(t, 503, h.status)
			mode := map[bool]string{true: "open", false: "closed"}[open]
			assert.Equal(t, "store down (memory): connection refused; failing "+mode+"\n", h.raw)
			st := f.get(t, "/stats")
			assert.EqualValues(t, -1, st.body["keys"])
			assert.EqualValues(t, 1, st.body["degraded_total"])
			assert.EqualValues(t, 0, st.body["allowed_total"])
			assert.Equal(t, service.Stats{Degraded: 1}, f.srv.Stats(), "counted, as what it was")
			m := f.get(t, "/metrics").raw
			assert.Contains(t, m, `sluice_store_errors_total{store="memory"} 1`)
			assert.Contains(t, m, `sluice_decisions_total{policy="default",result="store_error"} 1`)
			if open {
				assert.Contains(t, m, `sluice_fail_open_decisions_total{policy="default"} 1`)
			} else {
				assert.Contains(t, m, `sluice_fail_open_decisions_total{policy="default"} 0`)
			}
			bs.set(false)
			assert.Equal(t, 200, f.get(t, "/allow?key=x").status)
			assert.Equal(t, 200, f.get(t, "/healthz").status)
		})
	}
}

func TestMetrics(t *testing.T) {
	f := newFixture(t, nil)
	for range 12 {
		f.get(t, "/allow?key=m")
	}
	m := f.get(t, "/metrics").raw
	assert.Contains(t, m, `sluice_decisions_total{policy="default",result="allowed"} 10`)
	assert.Contains(t, m, `sluice_decisions_total{policy="default",result="denied"} 2`)
	assert.Contains(t, m, `sluice_store_latency_seconds_count{store="memory"} 12`)
	// Readable bucket bounds, 2 µs … 0.5 s in 1-2-5 steps, as documented.
	var les []string
	for _, m := range regexp.MustCompile(`sluice_store_latency_seconds_bucket\{store="memory",le="([^"]+)"\}`).FindAllStringSubmatch(m, -1) {
		les = append(les, m[1])
	}
	assert.Equal(t, []string{"2e-06", "5e-06", "1e-05", "2e-05", "5e-05", "0.0001", "0.0002", "0.0005",
		"0.001", "0.002", "0.005", "0.01", "0.02", "0.05", "0.1", "0.2", "0.5", "+Inf"}, les)
	assert.Contains(t, m, `go_goroutines`)
}

func TestNewRejectsBadConfig(t *testing.T) {
	_, err := service.New(service.Config{Default: store.Policy{Rate: 1, Burst: 1}})
	require.Error(t, err)
	m := store.NewMemory()
	defer m.Close()
	_, err = service.New(service.Config{Store: m, Default: store.Policy{Rate: 0, Burst: 1}})
	require.ErrorContains(t, err, "rate 0")
	_, err = service.New(service.Config{Store: m, Default: store.Policy{Rate: 1, Burst: 1},
		Limits: map[string]store.Policy{"k": {Rate: 1, Burst: 0}}})
	require.ErrorContains(t, err, `"k"`)
}

// cancellingStore plays a caller that gives up while the store works: it
// cancels the request's context, then waits for it.
type cancellingStore struct {
	store.Store
	cancel context.CancelFunc
}

func (c *cancellingStore) Allow(ctx context.Context, k string, n int64, p store.Policy) (store.Result, error) {
	c.cancel()
	<-ctx.Done()
	return store.Result{}, ctx.Err()
}

// A request whose caller gave up is counted as canceled: not a store error,
// not a decision.
func TestCanceledRequestsAreCounted(t *testing.T) {
	cs := &cancellingStore{}
	f := newFixture(t, func(c *service.Config) { cs.Store = c.Store; c.Store = cs })
	ctx, cancel := context.WithCancel(context.Background())
	cs.cancel = cancel
	req := httptest.NewRequest(http.MethodGet, "/allow?key=c", nil).WithContext(ctx)
	f.srv.ServeHTTP(httptest.NewRecorder(), req)
	assert.Equal(t, service.Stats{Canceled: 1}, f.srv.Stats())
	m := f.get(t, "/metrics").raw
	assert.Contains(t, m, `sluice_decisions_total{policy="default",result="canceled"} 1`)
	assert.Contains(t, m, `sluice_store_errors_total{store="memory"} 0`)
	assert.EqualValues(t, 1, f.get(t, "/stats").body["canceled_total"])
}

// TestSlowBodyTimesOut sends a POST whose body never completes: the server
// must answer 400 once BodyTimeout passes (with no http.Server ReadTimeout,
// as httptest's server has none), not hold the connection for as long as
// the client drips.
func TestSlowBodyTimesOut(t *testing.T) {
	f := newFixture(t, func(c *service.Config) { c.BodyTimeout = 50 * time.Millisecond })
	conn, err := net.Dial("tcp", f.ts.Listener.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.WriteString(conn, "POST /allow HTTP/1.1\r\nHost: sluice\r\n"+
		"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\nkey=a")
	require.NoError(t, err)
	// The client's own bound, far above BodyTimeout: reaching it is the failure.
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err, "no answer: the body read has no deadline")
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", raw)
	assert.Contains(t, string(raw), "reading body")
	assert.Equal(t, service.Stats{}, f.srv.Stats(), "nothing decided")
}
