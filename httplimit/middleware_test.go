package httplimit_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/httplimit"
	"github.com/sluice-go/sluice/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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

// TestPerIPOverLoopback is the default: limit by the peer's IP, every answer
// carrying the fields, the fourth request of a burst of 3 refused.
func TestPerIPOverLoopback(t *testing.T) {
	mem, clock := memory(t)
	lim, err := httplimit.NewMiddleware(mem, store.Policy{Rate: 1, Burst: 3})
	require.NoError(t, err)
	ts := serve(t, lim.Handler(hello))

	for i := 2; i >= 0; i-- {
		r := get(t, ts.URL)
		require.Equal(t, 200, r.status)
		assert.Equal(t, "hello\n", r.body)
		assert.Equal(t, `"default";q=1;w=1;sluice-burst=3`, r.header.Get("RateLimit-Policy"))
		assert.Equal(t, `"default";r=`+string(rune('0'+i))+`;t=1`, r.header.Get("RateLimit"))
		assert.Equal(t, "3", r.header.Get("X-RateLimit-Limit"))
		assert.Empty(t, r.header.Get("Retry-After"))
	}
	r := get(t, ts.URL)
	require.Equal(t, 429, r.status)
	assert.JSONEq(t, `{"allowed":false,"remaining":0,"limit":3,"rate":1,"retry_after_ms":1000}`, r.body)
	assert.Equal(t, "1", r.header.Get("Retry-After"))
	assert.Equal(t, `"default";r=0;t=1`, r.header.Get("RateLimit"))
	assert.Equal(t, "application/json", r.header.Get("Content-Type"))

	clock.Advance(time.Second)
	assert.Equal(t, 200, get(t, ts.URL).status)
}

// keyStore remembers the last key it was asked about.
type keyStore struct {
	store.Store
	last atomic.Value
}

func (k *keyStore) Allow(ctx context.Context, key string, n int64, p store.Policy) (store.Result, error) {
	k.last.Store(key)
	return k.Store.Allow(ctx, key, n, p)
}

func TestKeyByHeaderAndKeyFuncErrors(t *testing.T) {
	mem, _ := memory(t)
	lim, err := httplimit.NewMiddleware(mem, store.Policy{Rate: 1, Burst: 1}, httplimit.KeyByHeader("x-api-key"))
	require.NoError(t, err)
	ts := serve(t, lim.Handler(hello))
	r := get(t, ts.URL)
	assert.Equal(t, 400, r.status)
	assert.JSONEq(t, `{"error":"httplimit: missing X-Api-Key header"}`, r.body)
	assert.Equal(t, 200, get(t, ts.URL, "X-Api-Key", "a").status)
	assert.Equal(t, 429, get(t, ts.URL, "X-Api-Key", "a").status)
	assert.Equal(t, 200, get(t, ts.URL, "X-Api-Key", "b").status, "another key, another bucket")

	long := strings.Repeat("k", httplimit.MaxKeyLen+1)
	r = get(t, ts.URL, "X-Api-Key", long)
	assert.Equal(t, 400, r.status, "a key the service would refuse must not become a store error (fail open)")
	assert.Contains(t, r.body, "over 256 bytes")
	assert.Equal(t, 200, get(t, ts.URL, "X-Api-Key", long[1:]).status)

	lim, err = httplimit.NewMiddleware(mem, store.Policy{Rate: 1, Burst: 1},
		httplimit.KeyFunc(func(*http.Request) (string, error) { return "", nil }))
	require.NoError(t, err)
	w := httptest.NewRecorder()
	lim.Handler(hello).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	assert.Equal(t, 400, w.Code)
	assert.JSONEq(t, `{"error":"httplimit: empty rate-limit key"}`, w.Body.String())

	lim, err = httplimit.NewMiddleware(mem, store.Policy{Rate: 1, Burst: 1},
		httplimit.KeyFunc(func(*http.Request) (string, error) { return "", errors.New("no tenant") }))
	require.NoError(t, err)
	w = httptest.NewRecorder()
	lim.Handler(hello).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	assert.Equal(t, 400, w.Code)
	assert.JSONEq(t, `{"error":"no tenant"}`, w.Body.String())
}

// TestPerKeyAndPerRoute: Limits gives a key its own policy; two routes over
// one store keep apart with KeyPrefix.
func TestPerKeyAndPerRoute(t *testing.T) {
	mem, _ := memory(t)
	byTenant := httplimit.KeyByHeader("Tenant")
	search, err := httplimit.NewMiddleware(mem, store.Policy{Rate: 1, Burst: 1}, byTenant,
		httplimit.KeyPrefix("search:"), httplimit.Limits(map[string]store.Policy{"big": {Rate: 100, Burst: 3}}))
	require.NoError(t, err)
	upload, err := httplimit.NewMiddleware(mem, store.Policy{Name: "upload", Rate: 1, Burst: 2}, byTenant, httplimit.KeyPrefix("upload:"))
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/search", search.Handler(hello))
	mux.Handle("/upload", upload.Handler(hello))
	ts := serve(t, mux)

	var codes []int
	for range 4 {
		codes = append(codes, get(t, ts.URL+"/search", "Tenant", "big").status)
	}
	assert.Equal(t, []int{200, 200, 200, 429}, codes, "big has a burst of 3")
	r := get(t, ts.URL+"/search", "Tenant", "big")
	assert.Equal(t, `"big";q=100;w=1;sluice-burst=3`, r.header.Get("RateLimit-Policy"))

	codes = nil
	for range 3 {
		codes = append(codes, get(t, ts.URL+"/upload", "Tenant", "big").status)
	}
	assert.Equal(t, []int{200, 200, 429}, codes, "upload counts apart from search")
	assert.Equal(t, `"upload";q=1;w=1;sluice-burst=2`, get(t, ts.URL+"/upload", "Tenant", "big").header.Get("RateLimit-Policy"))
}

// flaky fails every call while down is set.
type flaky struct {
	store.Store
	down atomic.Bool
}

var errDown = errors.New("connection refused")

func (f *flaky) Allow(ctx context.Context, k string, n int64, p store.Policy) (store.Result, error) {
	if f.down.Load() {
		return store.Result{}, errDown
	}
	return f.Store.Allow(ctx, k, n, p)
}

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func TestStoreFailure(t *testing.T) {
	for _, mode := range []store.FailMode{0, store.FailOpen, store.FailClosed} {
		open := mode != store.FailClosed // the zero FailMode is the default, open
		t.Run(mode.String(), func(t *testing.T) {
			mem, _ := memory(t)
			fs := &flaky{Store: mem}
			var logs syncBuffer
			opts := []httplimit.MiddlewareOption{httplimit.Logger(slog.New(slog.NewTextHandler(&logs, nil)))}
			if mode != 0 {
				opts = append(opts, httplimit.FailMode(mode))
			}
			lim, err := httplimit.NewMiddleware(fs, store.Policy{Rate: 1, Burst: 100}, opts...)
			require.NoError(t, err)
			ts := serve(t, lim.Handler(hello))

			for outage := 1; outage <= 2; outage++ {
				fs.down.Store(true)
				for range 5 {
					r := get(t, ts.URL)
					assert.Equal(t, `"default";q=1;w=1;sluice-burst=100`, r.header.Get("RateLimit-Policy"))
					if open {
						assert.Equal(t, 200, r.status)
						assert.Equal(t, "hello\n", r.body)
						assert.Empty(t, r.header.Get("RateLimit"), "remaining is unknown: no RateLimit field")
					} else {
						assert.Equal(t, 429, r.status)
						assert.Equal(t, "1", r.header.Get("Retry-After"))
						assert.Equal(t, `"default";r=0;t=1`, r.header.Get("RateLimit"))
						assert.JSONEq(t, `{"allowed":false,"limit":100,"rate":1,"retry_after_ms":1000,"degraded":"store unavailable; failing closed"}`, r.body)
					}
				}
				fs.down.Store(false)
				for range 3 {
					assert.Equal(t, 200, get(t, ts.URL).status)
				}
				out := logs.String()
				assert.Equal(t, outage, strings.Count(out, "store failing"), "logged once per outage:\n%s", out)
				assert.Equal(t, outage, strings.Count(out, "store recovered"), out)
			}
		})
	}
}

func TestNewMiddlewareErrors(t *testing.T) {
	mem, _ := memory(t)
	_, err := httplimit.NewMiddleware(nil, store.Policy{Rate: 1, Burst: 1})
	assert.ErrorContains(t, err, "store is nil")
	_, err = httplimit.NewMiddleware(mem, store.Policy{Rate: 0, Burst: 1})
	assert.ErrorContains(t, err, `policy "default": rate 0`)
	_, err = httplimit.NewMiddleware(mem, store.Policy{Rate: 1, Burst: 1}, httplimit.Limits(map[string]store.Policy{"x": {Rate: 1}}))
	assert.ErrorContains(t, err, `limit for key "x"`)
	_, err = httplimit.NewMiddleware(mem, store.Policy{Name: "é", Rate: 1, Burst: 1})
	assert.ErrorContains(t, err, "printable ASCII")
	_, err = httplimit.NewMiddleware(mem, store.Policy{Rate: 1, Burst: 1}, httplimit.StoreTimeout(0))
	assert.ErrorContains(t, err, "store timeout 0s")
}

// TestAllowedPathAllocs: past the first request of a key, an allowed
// request allocates nothing in the middleware (memory store, IPv4 key), and
// one thing for an IPv6 key.
func TestAllowedPathAllocs(t *testing.T) {
	mem, clock := memory(t)
	lim, err := httplimit.NewMiddleware(mem, store.Policy{Rate: 1e6, Burst: 200})
	require.NoError(t, err)
	h := lim.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	w := &nopWriter{h: http.Header{}}
	h.ServeHTTP(w, req)
	allocs := testing.AllocsPerRun(200, func() {
		clock.Advance(time.Millisecond) // refill: every request is allowed
		h.ServeHTTP(w, req)
	})
	assert.Zero(t, allocs)
	assert.Equal(t, `"default";r=199;t=1`, w.h.Get("RateLimit"))

	// An IPv6 client's key, its network in CIDR form, is built per request.
	req.RemoteAddr = "[2001:db8::7]:4711"
	h.ServeHTTP(w, req)
	allocs = testing.AllocsPerRun(200, func() {
		clock.Advance(time.Millisecond)
		h.ServeHTTP(w, req)
	})
	assert.Equal(t, 1.0, allocs)
}

type nopWriter struct{ h http.Header }

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *nopWriter) WriteHeader(int)             {}
