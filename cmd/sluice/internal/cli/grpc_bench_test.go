package cli

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-go/sluice/cmd/sluice/redisstore"
	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/store"
)

// BenchmarkLoopbackGRPC is Envoy's ShouldRateLimit over real gRPC on
// loopback, 32 channels (each its own HTTP/2 connection, as Envoy's
// workers keep) driven as hard as they go, one descriptor per request
// matched by a rules file: ns/op is the inverse of the peak, cpu-ns/op the
// CPU time of the whole process (server and grpc-go client) per request.
// Rows:
//
//   - floor: a bare grpc-go server whose ShouldRateLimit answers OK and
//     decides nothing (the transport's floor);
//   - serve-memory, serve-redis: RunServer with WithGRPC, as `sluice serve
//     -grpc -config` runs, on the memory store and on a redis-server
//     started for the run (skipped without one);
//   - serve-memory-grpc-go: serve-memory on GRPCLimits.Transport
//     "grpc-go" (grpc-go serving every call, as before the h2grpc
//     transport);
//   - floor-deadline, serve-memory-deadline: the same with a 1 s deadline
//     on every call, sent as grpc-timeout, as Envoy sends its filter's
//     timeout (a call without one costs the server a timer of its own:
//     GRPCLimits.RecvTimeout).
//
// Compare the rows of one run: serve-memory ÷ floor is the service's share
// of the transport's peak; BenchmarkLoopback's rows are the HTTP side.
func BenchmarkLoopbackGRPC(b *testing.B) {
	floor := func(b *testing.B, deadline time.Duration) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		g := grpc.NewServer()
		rlsv3.RegisterRateLimitServiceServer(g, okService{})
		done := make(chan struct{})
		go func() { _ = g.Serve(ln); close(done) }()
		b.Cleanup(func() { g.Stop(); <-done })
		loopbackGRPC(b, ln.Addr().String(), deadline)
	}
	b.Run("floor", func(b *testing.B) { floor(b, 0) })
	b.Run("floor-deadline", func(b *testing.B) { floor(b, time.Second) })
	b.Run("serve-memory", func(b *testing.B) {
		serveGRPC(b, store.NewMemory(), 0)
	})
	b.Run("serve-memory-grpc-go", func(b *testing.B) {
		serveGRPCOn(b, store.NewMemory(), 0, "grpc-go")
	})
	b.Run("serve-memory-deadline", func(b *testing.B) {
		serveGRPC(b, store.NewMemory(), time.Second)
	})
	b.Run("serve-redis", func(b *testing.B) {
		srv := redistest.Start(b)
		s, err := redisstore.Open(srv.URL())
		if err != nil {
			b.Fatal(err)
		}
		serveGRPC(b, s, 0)
	})
}

type okService struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (okService) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 999}}}, nil
}

// serveGRPC runs RunServer with WithGRPC on st under a rules file of one
// descriptor key "k", 1000/s per value, and drives it (deadline as
// loopbackGRPC).
func serveGRPC(b *testing.B, st store.Store, deadline time.Duration) {
	serveGRPCOn(b, st, deadline, "")
}

// serveGRPCOn is serveGRPC on the gRPC transport named (GRPCLimits.Transport).
func serveGRPCOn(b *testing.B, st store.Store, deadline time.Duration, transport string) {
	rc, err := rules.Parse("perf.yaml", []byte("domain: perf\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1000}\n"))
	if err != nil {
		b.Fatal(err)
	}
	// A store timeout far above a round trip: a loaded machine's stall
	// must not turn into a failed-closed OVER_LIMIT that stops the run.
	c := service.Config{Store: st, Default: store.Policy{Rate: 1000, Burst: 1000}, Rules: rc,
		StoreTimeout: 5 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- RunServer(ctx, c, "127.0.0.1:0", c.Logger, nil,
			WithGRPCLimits("127.0.0.1:0", GRPCLimits{Transport: transport}, func(a net.Addr) { addr <- a.String() }))
	}()
	a := <-addr
	b.Cleanup(func() { cancel(); <-done; st.Close() })
	loopbackGRPC(b, a, deadline)
}

// loopbackGRPC sends ShouldRateLimit for domain "perf", descriptor k=kN,
// over 32 channels until b.N answers came back, each checked to be OK; each
// call with deadline (as grpc-timeout) if it is not 0.
func loopbackGRPC(b *testing.B, addr string, deadline time.Duration) {
	var next atomic.Int64
	b.SetParallelism(16) // 32 channels on 2 cores, as the peers harness's peak
	b.ReportAllocs()
	cpu0 := processCPU()
	defer func() { b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op") }()
	b.RunParallel(func(pb *testing.PB) {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Error(err)
			return
		}
		defer cc.Close()
		c := rlsv3.NewRateLimitServiceClient(cc)
		base := int(next.Add(1)) * 1000
		reqs := make([]*rlsv3.RateLimitRequest, 64)
		for i := range reqs {
			reqs[i] = &rlsv3.RateLimitRequest{Domain: "perf", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
				Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "k" + strconv.Itoa(base+i)}}}}}
		}
		ctx := context.Background()
		for i := 0; pb.Next(); i++ {
			ctx, cancel := ctx, context.CancelFunc(func() {})
			if deadline > 0 {
				ctx, cancel = context.WithTimeout(ctx, deadline)
			}
			resp, err := c.ShouldRateLimit(ctx, reqs[i&63])
			cancel()
			if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				b.Errorf("code %v, err %v", resp.GetOverallCode(), err)
				return
			}
		}
	})
}
