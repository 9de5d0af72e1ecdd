package service_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/sluice-go/sluice/service"
	"github.com/sluice-go/sluice/service/rules"
	"github.com/sluice-go/sluice/service/store"
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
	mem := store.NewMemory()
	defer mem.Close()
	srv, err := service.New(service.Config{Store: mem, Default: store.Policy{Rate: 1e6, Burst: 1e6}, Rules: c,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	reqs := make([]*http.Request, 1024)
	for i := range reqs {
		reqs[i] = httptest.NewRequest(http.MethodGet, "/allow?key=k"+strconv.Itoa(i), nil)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, reqs[i&1023])
		if w.Code != 200 {
			b.Fatal(w.Code)
		}
	}
}
