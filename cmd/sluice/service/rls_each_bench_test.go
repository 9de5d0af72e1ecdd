//go:build unix

package service

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"syscall"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-go/sluice/cmd/sluice/redisstore"
	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/store"
)

// noEach, embedded beside a store, hides the store's AllowEach (two
// embedded fields with the method at one depth: neither is promoted), so
// the gate asks the store one descriptor after another, as before requests
// went to it in one call, while its other methods (and selfbound marks)
// stay.
//
//lint:ignore U1000 used by being embedded: it hides the stores' AllowEach
type noEach struct{}

//lint:ignore U1000 never called: it only makes AllowEach ambiguous
func (noEach) AllowEach() {}

type (
	memOneByOne struct {
		*store.Memory
		noEach //lint:ignore U1000 see noEach
	}
	redisOneByOne struct {
		*redisstore.Store
		noEach //lint:ignore U1000 see noEach
	}
)

// BenchmarkShouldRateLimit3 is ShouldRateLimit's cost for a request of
// three descriptors, without gRPC, on the memory store and a real Redis:
// "one-call" gives them to the store in one call (store.Batch; on Redis one
// round trip), "in-turn" one after another. One caller at a time, so ns/op
// is a request's latency; cpu-µs/op (this process's CPU time: not Redis's)
// and allocs/op are its cost:
//
//	SLUICE_REQUIRE_REDIS=1 go test -run '^$' -bench ShouldRateLimit3 -count 5 ./service
func BenchmarkShouldRateLimit3(b *testing.B) {
	yaml := "domain: http\ndescriptors:\n"
	for j := range 3 {
		yaml += "  - key: key" + strconv.Itoa(j) + "\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n"
	}
	c, err := rules.Parse("bench.yaml", []byte(yaml))
	if err != nil {
		b.Fatal(err)
	}
	rs, err := redisstore.Open(redistest.Start(b).URL())
	if err != nil {
		b.Fatal(err)
	}
	defer rs.Close()
	reqs := make([]*rlsv3.RateLimitRequest, 1024)
	for i := range reqs {
		r := &rlsv3.RateLimitRequest{Domain: "http"}
		for j := range 3 {
			r.Descriptors = append(r.Descriptors, &ratelimitv3.RateLimitDescriptor{
				Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "key" + strconv.Itoa(j), Value: "k" + strconv.Itoa(i)}}})
		}
		reqs[i] = r
	}
	mem := store.NewMemory()
	defer mem.Close()
	for _, name := range []string{"memory/one-call", "memory/in-turn", "redis/one-call", "redis/in-turn"} {
		b.Run(name, func(b *testing.B) {
			var st store.Store
			switch name {
			case "memory/one-call":
				st = mem
			case "memory/in-turn":
				st = memOneByOne{Memory: mem}
			case "redis/one-call":
				st = rs
			default:
				st = redisOneByOne{Store: rs}
			}
			if _, batch := st.(store.Batch); batch != strings.HasSuffix(name, "one-call") {
				b.Fatalf("%s: %T is a store.Batch: %v", name, st, batch)
			}
			srv, err := New(Config{Store: st, Default: store.Policy{Rate: 1e6, Burst: 1e6}, Rules: c,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				b.Fatal(err)
			}
			g := &rateLimitService{s: srv}
			ctx := context.Background()
			b.ReportAllocs()
			cpu0 := cpuTime()
			for i := 0; b.Loop(); i++ {
				r, err := g.ShouldRateLimit(ctx, reqs[i&1023])
				if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
					b.Fatal(r, err)
				}
			}
			b.ReportMetric(float64(cpuTime()-cpu0)/1e3/float64(b.N), "cpu-µs/op")
		})
	}
}

// cpuTime is the CPU time this process has used (user + system), in ns.
func cpuTime() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
