package bench_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
	"github.com/sluice-go/sluice/internal/leasealloc"
	"github.com/sluice-go/sluice/lease"
	"github.com/sluice-go/sluice/ratelimiter"
	"github.com/sluice-go/sluice/store"
)

// leaseLimiter returns a limiter deciding under a lease: a lease.Bucket
// holding the whole of a policy of fastRate and fastBurst (the only holder,
// for an hour), from an allocator in memory, under ratelimiter.Shared.
// Nothing renews during the benchmark: the share outlasts it, so what is
// timed is the local decision alone.
func leaseLimiter(b *testing.B) *ratelimiter.Limiter {
	ctx := context.Background()
	alloc, err := leasealloc.New(leasealloc.Config{
		Policies: map[string]leasealloc.Policy{"p": {Rate: fastRate, Burst: fastBurst}},
		Lease:    time.Hour, Refresh: 30 * time.Minute, NoLearning: true}, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	tr := lease.TransportFunc(func(_ context.Context, req *lease.Request) (*lease.Response, error) {
		return alloc.RenewAt(time.Now(), req)
	})
	c, err := lease.NewClient(ctx, tr, lease.Options{})
	if err != nil {
		b.Fatal(err)
	}
	bk, err := c.Bucket(ctx, "p", "k")
	if err != nil {
		b.Fatal(err)
	}
	bk.Want(fastRate)
	if err := c.Refresh(ctx); err != nil {
		b.Fatal(err)
	}
	if r, _, _ := bk.Share(); r != fastRate {
		b.Fatalf("share %v, want the whole policy %v", r, float64(fastRate))
	}
	rate, burst := bk.Limit()
	l, err := ratelimiter.New(ctx, rate, int(burst), ratelimiter.Shared(bk))
	if err != nil {
		b.Fatal(err)
	}
	// A new share starts empty: let it fill before timing.
	for !l.TryAcquire(1) {
		time.Sleep(time.Millisecond)
	}
	b.Cleanup(func() { l.Stop() })
	return l
}

// BenchmarkLease: a decision under a capacity lease (ratelimiter.Shared over
// a lease.Bucket) against the same decision of a local limiter of the same
// rate, and against asking a server per decision: GET /allow over HTTP/1.1
// and Envoy's ShouldRateLimit over gRPC, each to a service.Server (what
// `sluice serve` runs) on loopback, one call at a time from one goroutine
// (the latency a replica pays per decision without a lease). Every
// decision is an allow. Run each pass with -count 1 and repeat the passes,
// so that every row sees the same load (docs/benchmarks.md).
func BenchmarkLease(b *testing.B) {
	ctx := context.Background()
	b.Run("op=Acquire/impl=local", func(b *testing.B) {
		l := newFast(b)
		parallel(b, 1, func() { _ = l.Acquire(ctx, 1) })
	})
	b.Run("op=Acquire/impl=lease", func(b *testing.B) {
		l := leaseLimiter(b)
		parallel(b, 1, func() { _ = l.Acquire(ctx, 1) })
	})
	b.Run("op=TryAcquire/impl=local", func(b *testing.B) {
		l := newFast(b)
		parallel(b, 1, func() { l.TryAcquire(1) })
	})
	b.Run("op=TryAcquire/impl=lease", func(b *testing.B) {
		l := leaseLimiter(b)
		parallel(b, 1, func() { l.TryAcquire(1) })
	})
	b.Run("op=TryAcquire/impl=lease-g2", func(b *testing.B) {
		l := leaseLimiter(b)
		parallel(b, 2, func() { l.TryAcquire(1) })
	})
	b.Run("op=TryAcquire/impl=local-g2", func(b *testing.B) {
		l := newFast(b)
		parallel(b, 2, func() { l.TryAcquire(1) })
	})
	b.Run("op=decide/impl=allow-http", func(b *testing.B) {
		srv := newLeaseBenchServer(b)
		addr := serveHTTP(b, srv)
		h := &httpDecider{addr: addr}
		defer h.close()
		keys := leaseBenchKeys()
		i := 0
		parallel(b, 1, func() {
			ok, err := h.decide(ctx, keys[i&63])
			if err != nil || !ok {
				b.Fatalf("allowed %v, err %v", ok, err)
			}
			i++
		})
	})
	b.Run("op=decide/impl=grpc-rls", func(b *testing.B) {
		srv := newLeaseBenchServer(b)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		g := grpc.NewServer()
		srv.RegisterRateLimitService(g)
		done := make(chan struct{})
		go func() { _ = g.Serve(ln); close(done) }()
		defer func() { g.Stop(); <-done }()
		cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer cc.Close()
		d := rlsDecider{c: rlsv3.NewRateLimitServiceClient(cc), domain: "perf", desc: "k"}
		keys := leaseBenchKeys()
		i := 0
		parallel(b, 1, func() {
			ok, err := d.decide(ctx, keys[i&63])
			if err != nil || !ok {
				b.Fatalf("allowed %v, err %v", ok, err)
			}
			i++
		})
	})
}

func leaseBenchKeys() []string {
	keys := make([]string, 64)
	for i := range keys {
		keys[i] = "k" + string(rune('A'+i%26)) + string(rune('a'+i/26))
	}
	return keys
}

// newLeaseBenchServer is a service.Server on the memory store, every key
// 1000/s (the default policy for /allow, the rules' descriptor k for
// ShouldRateLimit), as `sluice serve -grpc -config` runs it.
func newLeaseBenchServer(b *testing.B) *service.Server {
	rc, err := rules.Parse("perf.yaml", []byte("domain: perf\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1000}\n"))
	if err != nil {
		b.Fatal(err)
	}
	st := store.NewMemory()
	b.Cleanup(func() { st.Close() })
	srv, err := service.New(service.Config{Store: st, Default: store.Policy{Rate: 1000, Burst: 1000}, Rules: rc,
		StoreTimeout: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	return srv
}

// serveHTTP serves h on a loopback port until b ends and returns its address.
func serveHTTP(b *testing.B, h http.Handler) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { _ = hs.Serve(ln); close(done) }()
	b.Cleanup(func() { _ = hs.Close(); <-done })
	return ln.Addr().String()
}
