package service

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
	"github.com/sluice-go/sluice/store"
)

// BenchmarkShouldRateLimitHandler is ShouldRateLimit's own cost for one
// descriptor (memory store), without gRPC or the network; compare
// BenchmarkAllowHandlerRules, the same decision through /allow.
func BenchmarkShouldRateLimitHandler(b *testing.B) {
	c, err := rules.Parse("bench.yaml", []byte("domain: http\ndescriptors:\n  - key: key\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n"))
	if err != nil {
		b.Fatal(err)
	}
	mem := store.NewMemory()
	defer mem.Close()
	srv, err := New(Config{Store: mem, Default: store.Policy{Rate: 1e6, Burst: 1e6}, Rules: c,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	g := &rateLimitService{s: srv}
	reqs := make([]*rlsv3.RateLimitRequest, 1024)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "http", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "key", Value: "k" + strconv.Itoa(i)}}}}}
	}
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		r, err := g.ShouldRateLimit(ctx, reqs[i&1023])
		if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
			b.Fatal(r, err)
		}
	}
}
