package service_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
	"github.com/sluice-go/sluice/store"
)

// BenchmarkAllowHandler is the handler's own cost per /allow (memory store),
// without the network: the part of a request's latency this code controls.
func BenchmarkAllowHandler(b *testing.B) {
	benchAllow(b, nil)
}

// BenchmarkAllowHandlerRules is the same when the key matches a rule (-config).
func BenchmarkAllowHandlerRules(b *testing.B) {
	c, err := rules.Parse("bench.yaml", []byte("domain: http\ndescriptors:\n  - key: key\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n"))
	if err != nil {
		b.Fatal(err)
	}
	benchAllow(b, c)
}

func benchAllow(b *testing.B, c *rules.Config) {
	srv, reqs := benchServer(b, store.Policy{Rate: 1e6, Burst: 1e6}, c)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, reqs[i&1023])
		if w.Code != 200 {
			b.Fatal(w.Code)
		}
	}
}

// benchServer is a Server on a fresh memory store with default policy p
// (and rules c, if any), and 1024 /allow requests for distinct keys.
func benchServer(b *testing.B, p store.Policy, c *rules.Config) (*service.Server, []*http.Request) {
	mem := store.NewMemory()
	b.Cleanup(func() { mem.Close() })
	srv, err := service.New(service.Config{Store: mem, Default: p, Rules: c,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	reqs := make([]*http.Request, 1024)
	for i := range reqs {
		reqs[i] = httptest.NewRequest(http.MethodGet, "/allow?key=k"+strconv.Itoa(i), nil)
	}
	return srv, reqs
}

// discardWriter is the cheapest http.ResponseWriter: one header map, cleared
// per request, and the body dropped. Through it a benchmark counts what the
// handler itself allocates (httptest.ResponseRecorder allocates a recorder,
// a header map and a buffer per request, which net/http does not).
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header               { return w.h }
func (w *discardWriter) WriteHeader(status int)            { w.status = status }
func (w *discardWriter) Write(p []byte) (int, error)       { return len(p), nil }
func (w *discardWriter) WriteString(s string) (int, error) { return len(s), nil }

// BenchmarkAllowHandlerOwn is one /allow on the memory store through
// discardWriter: the handler's own time and allocations per decision.
func BenchmarkAllowHandlerOwn(b *testing.B) {
	for _, c := range []struct {
		name   string
		p      store.Policy
		status int
	}{
		{"allowed", store.Policy{Rate: 1e6, Burst: 1e6}, http.StatusOK},
		{"denied", store.Policy{Rate: 1.0 / 3600, Burst: 1}, http.StatusTooManyRequests},
	} {
		b.Run(c.name, func(b *testing.B) {
			srv, reqs := benchServer(b, c.p, nil)
			for _, r := range reqs {
				srv.ServeHTTP(&discardWriter{h: http.Header{}}, r) // known keys; drained when denied
			}
			w := &discardWriter{h: http.Header{}}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				clear(w.h)
				srv.ServeHTTP(w, reqs[i&1023])
				if w.status != c.status {
					b.Fatal(w.status)
				}
			}
		})
	}
}
