package main

import (
	"bytes"
	"log/slog"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The demo's answers are the same over every store: 5 allowed, 3 refused.
// The test runs at one request every 5 s so that a slow machine cannot
// refill a token between two requests.
const want = ` 1  200  RateLimit: "per-ip";r=4;t=5  RateLimit-Policy: "per-ip";q=1;w=5;sluice-burst=5
 2  200  RateLimit: "per-ip";r=3;t=5
 3  200  RateLimit: "per-ip";r=2;t=5
 4  200  RateLimit: "per-ip";r=1;t=5
 5  200  RateLimit: "per-ip";r=0;t=5
 6  429  RateLimit: "per-ip";r=0;t=5  Retry-After: 5  {"allowed":false,…}
 7  429  RateLimit: "per-ip";r=0;t=5  Retry-After: 5  {"allowed":false,…}
 8  429  RateLimit: "per-ip";r=0;t=5  Retry-After: 5  {"allowed":false,…}
`

func runDemo(t *testing.T, spec, storeName string) {
	var out bytes.Buffer
	// A generous store timeout: a loaded CI machine must not turn a slow
	// loopback call into a fail-open answer.
	require.NoError(t, run(Config{Store: spec, Rate: 0.2, Burst: 5, Requests: 8, StoreTimeout: 10 * time.Second}, "", &out))
	head, rest, _ := strings.Cut(out.String(), "\n")
	assert.Equal(t, "API limited to 0.2/s, burst 5, per IP, over the "+storeName+" store", head)
	assert.Equal(t, want, rest)
}

func TestDemoMemory(t *testing.T) { runDemo(t, "memory", "memory") }

func TestDemoShm(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the shm store is Linux-only on this branch")
	}
	runDemo(t, "shm:"+t.TempDir(), "shm")
}

func TestDemoRedis(t *testing.T) { runDemo(t, redistest.Start(t).URL(), "redis") }

func TestDemoService(t *testing.T) {
	mem := store.NewMemory()
	defer mem.Close()
	svc, err := service.New(service.Config{Store: mem, Default: store.Policy{Name: "per-ip", Rate: 0.2, Burst: 5},
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	ts := httptest.NewServer(svc)
	defer ts.Close()
	runDemo(t, ts.URL, "service")
}

func TestBadStore(t *testing.T) {
	err := run(Config{Store: "nope", Rate: 1, Burst: 1, Requests: 1, StoreTimeout: time.Second}, "", &bytes.Buffer{})
	assert.ErrorContains(t, err, `-store "nope"`)
}

func TestBadProxyFlags(t *testing.T) {
	cfg := Config{Store: "memory", Rate: 1, Burst: 1, Requests: 1, StoreTimeout: time.Second, Trust: []string{"nope"}}
	assert.ErrorContains(t, run(cfg, "", &bytes.Buffer{}), `trusted proxy "nope"`)
	cfg.Trust, cfg.ProxyHeader = []string{"127.0.0.1"}, "X-Real-IP"
	assert.ErrorContains(t, run(cfg, "", &bytes.Buffer{}), `proxy header "X-Real-IP"`)
}
