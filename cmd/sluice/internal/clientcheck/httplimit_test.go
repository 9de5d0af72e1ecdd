package clientcheck_test

// The httplimit middleware over the stores of this module: a running
// service seen through the client, and Redis.

import (
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/client"
	"github.com/sluice-go/sluice/cmd/sluice/redisstore"
	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/httplimit"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/store"
)

// slowOK is a store timeout generous enough that a loaded CI machine never
// turns a slow loopback call into a fail-mode answer; the outage cases here
// fail fast (connection refused).
var slowOK = httplimit.StoreTimeout(10 * time.Second)

// twoHosts serves two loopback servers, each with its own middleware over
// its own store (as two hosts would have), and returns their URLs.
func twoHosts(t *testing.T, stores [2]store.Store, p store.Policy, opts ...httplimit.MiddlewareOption) [2]string {
	var urls [2]string
	for i, st := range stores {
		lim, err := httplimit.NewMiddleware(st, p, opts...)
		require.NoError(t, err)
		urls[i] = serve(t, lim.Handler(hello)).URL
	}
	return urls
}

// alternate sends n requests, alternating between the two hosts, and
// returns the statuses.
func alternate(t *testing.T, urls [2]string, n int, hdr ...string) []int {
	var codes []int
	for i := range n {
		codes = append(codes, get(t, urls[i%2], hdr...).status)
	}
	return codes
}

// TestMiddlewareRedis: two hosts, each with its own connection to a real
// redis-server, share one limit per IP.
func TestMiddlewareRedis(t *testing.T) {
	srv := redistest.Start(t)
	var stores [2]store.Store
	for i := range stores {
		st, err := redisstore.Open(srv.URL())
		require.NoError(t, err)
		t.Cleanup(func() { _ = st.Close() })
		stores[i] = st
	}
	urls := twoHosts(t, stores, store.Policy{Name: "api", Rate: 1.0 / 60, Burst: 3}, slowOK)
	assert.Equal(t, []int{200, 200, 200, 429, 429}, alternate(t, urls, 5), "3 in all, across both hosts")
	r := get(t, urls[0])
	assert.Equal(t, 429, r.status)
	assert.Equal(t, `"api";q=1;w=60;sluice-burst=3`, r.header.Get("RateLimit-Policy"))
	assert.Equal(t, "60", r.header.Get("Retry-After"))

	// The outage: redis-server killed. Fail closed answers at once with the
	// degraded 429; the server coming back ends it with no restart.
	lim, err := httplimit.NewMiddleware(stores[0], store.Policy{Name: "api", Rate: 1.0 / 60, Burst: 3},
		httplimit.FailMode(store.FailClosed), httplimit.KeyByHeader("X-Key"), httplimit.Logger(slog.New(slog.DiscardHandler)), slowOK)
	require.NoError(t, err)
	closed := serve(t, lim.Handler(hello)).URL
	srv.Kill()
	r = get(t, closed, "X-Key", "k")
	assert.Equal(t, 429, r.status)
	assert.Contains(t, r.body, "store unavailable; failing closed")
	srv.Restart()
	assert.Equal(t, 200, get(t, closed, "X-Key", "k").status)
}

// TestMiddlewareService: two hosts ask a running service (over loopback,
// through client.Store) and share its limit; with the service gone, the
// middleware's own fail mode answers.
func TestMiddlewareService(t *testing.T) {
	policy := store.Policy{Name: "api", Rate: 1.0 / 60, Burst: 3}
	mem := store.NewMemory()
	t.Cleanup(func() { _ = mem.Close() })
	svc, err := service.New(service.Config{Store: mem, Default: policy, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	svcSrv := serve(t, svc)

	var stores [2]store.Store
	for i := range stores {
		c, err := client.New(svcSrv.URL, client.WithTimeout(10*time.Second))
		require.NoError(t, err)
		st := c.Store()
		t.Cleanup(func() { _ = st.Close() })
		stores[i] = st
	}
	urls := twoHosts(t, stores, policy, httplimit.KeyByHeader("X-Tenant"), slowOK)
	assert.Equal(t, []int{200, 200, 200, 429, 429}, alternate(t, urls, 5, "X-Tenant", "acme"))
	r := get(t, urls[1], "X-Tenant", "acme")
	assert.Equal(t, "60", r.header.Get("Retry-After"))
	assert.Contains(t, r.body, `{"allowed":false,"remaining":0`)
	assert.Contains(t, r.body, `"limit":3,"rate":0.016666666666666666,"retry_after_ms":`)
	assert.Equal(t, 200, get(t, urls[0], "X-Tenant", "other").status)

	// Keys and Ping go to /stats and /healthz.
	n, err := stores[0].Keys(t.Context())
	require.NoError(t, err)
	assert.EqualValues(t, 2, n)
	require.NoError(t, stores[0].Ping(t.Context()))

	svcSrv.Close()
	lim, err := httplimit.NewMiddleware(stores[0], policy, httplimit.FailMode(store.FailClosed), httplimit.KeyByHeader("X-Tenant"),
		httplimit.Logger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	closed := serve(t, lim.Handler(hello)).URL
	r = get(t, closed, "X-Tenant", "new")
	assert.Equal(t, 429, r.status)
	assert.Contains(t, r.body, "failing closed")
	assert.Equal(t, 200, get(t, urls[0], "X-Tenant", "new").status, "the first hosts fail open (the default)")
	_, err = stores[0].Allow(t.Context(), "k", 1, policy)
	assert.True(t, errors.Is(err, client.ErrUnavailable), "%v", err)
	require.NoError(t, stores[1].Close())
	_, err = stores[1].Allow(t.Context(), "k", 1, policy)
	assert.ErrorIs(t, err, store.ErrClosed)
}

// handClock drives a Memory store's time by hand.
type handClock struct {
	mu  sync.Mutex
	now time.Duration
}

func (c *handClock) Now() time.Duration      { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *handClock) Advance(d time.Duration) { c.mu.Lock(); c.now += d; c.mu.Unlock() }

func memory(t *testing.T) (*store.Memory, *handClock) {
	c := &handClock{now: time.Hour}
	m := store.NewMemory(store.WithClock(c.Now))
	t.Cleanup(func() { _ = m.Close() })
	return m, c
}

var hello = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "hello\n") })

type reply struct {
	status int
	header http.Header
	body   string
}

func get(t *testing.T, url string, hdr ...string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return reply{resp.StatusCode, resp.Header, string(b)}
}

func serve(t *testing.T, h http.Handler) *httptest.Server {
	ts := httptest.NewServer(h)
	t.Cleanup(func() { ts.Close(); http.DefaultClient.CloseIdleConnections() })
	return ts
}

// TestSameAnswerAsServe: the same decision, one through `sluice serve`'s
// handler and one through the middleware, gives the same status, fields and
// body (one implementation, not a copy).
func TestSameAnswerAsServe(t *testing.T) {
	p := store.Policy{Name: "fast", Rate: 100, Burst: 1}
	memA, clockA := memory(t)
	memB, clockB := memory(t)
	srv, err := service.New(service.Config{Store: memA, Default: p, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	lim, err := httplimit.NewMiddleware(memB, p, httplimit.KeyFunc(func(*http.Request) (string, error) { return "k", nil }))
	require.NoError(t, err)
	svc, mw := serve(t, srv), serve(t, lim.Handler(hello))

	for i, advance := range []time.Duration{0, 0, 3 * time.Millisecond, 7 * time.Millisecond} {
		clockA.Advance(advance)
		clockB.Advance(advance)
		a, b := get(t, svc.URL+"/allow?key=k"), get(t, mw.URL)
		require.Equal(t, a.status, b.status, "step %d", i)
		for _, h := range []string{"Ratelimit-Policy", "Ratelimit", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "Retry-After"} {
			assert.Equal(t, a.header[h], b.header[h], "step %d: %s", i, h)
		}
		if a.status == 429 {
			assert.Equal(t, a.body, b.body, "step %d", i)
		}
	}
}

// Limits shared by every replica through a running `sluice serve`: the
// client's Store makes the service a store.Store. Here the service runs in
// this process on loopback; in production it is its own process.
func Example_store() {
	policy := store.Policy{Name: "api", Rate: 1, Burst: 2}
	svc, err := service.New(service.Config{Store: store.NewMemory(), Default: policy, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	svcSrv := httptest.NewServer(svc)
	defer svcSrv.Close()

	c, err := client.New(svcSrv.URL, client.WithTimeout(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	limit, err := httplimit.NewMiddleware(c.Store(), policy, httplimit.KeyByHeader("X-Tenant"),
		httplimit.StoreTimeout(time.Second)) // past it, requests follow the fail mode (open)
	if err != nil {
		log.Fatal(err)
	}
	app := httptest.NewServer(limit.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	defer app.Close()

	for range 3 {
		req, _ := http.NewRequest(http.MethodGet, app.URL, nil)
		req.Header.Set("X-Tenant", "acme")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Printf("%d RateLimit: %s Retry-After: %q\n", resp.StatusCode, resp.Header.Get("RateLimit"), resp.Header.Get("Retry-After"))
	}
	// Output:
	// 200 RateLimit: "api";r=1;t=1 Retry-After: ""
	// 200 RateLimit: "api";r=0;t=1 Retry-After: ""
	// 429 RateLimit: "api";r=0;t=1 Retry-After: "1"
}
