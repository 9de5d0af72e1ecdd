package cli_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"runtime/metrics"
	"strconv"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/sluice-go/sluice/cmd/sluice/internal/cli"
	"github.com/sluice-go/sluice/cmd/sluice/leasegrpc"
	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
	"github.com/sluice-go/sluice/lease"
	"github.com/sluice-go/sluice/store"
)

// goroutinesCreated is how many goroutines this process has started.
func goroutinesCreated() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestGRPCCallsReuseGoroutines: WithGRPC answers calls on goroutines it
// keeps (grpc-go's stream workers), not on a new goroutine per call, whose
// stack grows again on every call. Calls one after another all find a
// worker free.
func TestGRPCCallsReuseGoroutines(t *testing.T) {
	c := service.Config{Store: store.NewMemory(), Default: store.Policy{Rate: 1000, Burst: 1000},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	t.Cleanup(func() { c.Store.Close() })
	client := startGRPC(t, c)
	req := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
	call := func() {
		_, err := client.ShouldRateLimit(context.Background(), req) // Background: no goroutine watches it
		require.NoError(t, err)
	}
	call() // the connection is set up
	const n = 200
	before := goroutinesCreated()
	for range n {
		call()
	}
	// Without workers, each call starts one; a few may start for other
	// reasons (the runtime's, the transport's).
	assert.Less(t, goroutinesCreated()-before, uint64(n/4))
}

// gate is a store whose decisions wait: each Allow reports on entered and
// waits for a value on release.
type gate struct {
	store.Store
	entered, release chan struct{}
}

func (g *gate) Allow(ctx context.Context, key string, cost int64, p store.Policy) (store.Result, error) {
	g.entered <- struct{}{}
	<-g.release
	return g.Store.Allow(ctx, key, cost, p)
}

// TestGRPCConcurrentCallsReuseGoroutines: calls in flight together, more
// of them than cores, each waiting on the store (as on Redis), still run
// on kept goroutines, on either transport: grpc-go's stream workers, a
// worker per call in flight rather than per core, and the Sluice
// transport's kept workers.
//
// Why the Sluice transport's calls are sent by hand: it runs a call alone
// on its connection on the connection's reader, which reads nothing more
// until the call returns, so a store that holds every call until all have
// arrived (this test's gate) would hold the first for ever whenever a
// client sent it before the others. Here every round opens its streams
// first (HEADERS, no message), then sends their messages, so each call
// finds the others open and goes to a worker.
func TestGRPCConcurrentCallsReuseGoroutines(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2)) // workers are sized when the server starts
	const inFlight, rounds = 32, 10
	start := func(t *testing.T, transport string) (*gate, string) {
		rc, err := rules.Parse("rules.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1000}\n"))
		require.NoError(t, err)
		g := &gate{Store: store.NewMemory(), entered: make(chan struct{}), release: make(chan struct{})}
		c := service.Config{Store: g, Default: store.Policy{Rate: 1000, Burst: 1000}, Rules: rc, StoreTimeout: time.Minute}
		return g, startGRPCConfig(t, c, cli.GRPCLimits{Transport: transport})
	}
	request := func(i int) *rlsv3.RateLimitRequest {
		// A key each: the service may serve one key's calls together.
		return &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: strconv.Itoa(i)}}}}}
	}
	// gated runs round (which starts inFlight calls and returns a function
	// that waits for their answers) with every call in a handler at once,
	// once to set up the connection and grow the workers' stacks, then
	// rounds times, counting the goroutines started meanwhile.
	gated := func(t *testing.T, g *gate, round func() (answered func())) uint64 {
		run := func() {
			answered := round()
			for range inFlight { // every call in a handler at once
				<-g.entered
			}
			for range inFlight {
				g.release <- struct{}{}
			}
			answered()
		}
		run()
		before := goroutinesCreated()
		for range rounds {
			run()
		}
		return goroutinesCreated() - before
	}

	t.Run("grpc-go", func(t *testing.T) {
		g, addr := start(t, "grpc-go")
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { cc.Close() })
		client := rlsv3.NewRateLimitServiceClient(cc)
		// Callers started up front, so that the goroutines counted are the
		// server's.
		begin, answers := make(chan struct{}), make(chan error)
		var wg sync.WaitGroup
		for i := range inFlight {
			req := request(i)
			wg.Go(func() {
				for range begin {
					_, err := client.ShouldRateLimit(context.Background(), req) // Background: no goroutine watches it
					answers <- err
				}
			})
		}
		defer func() { close(begin); wg.Wait() }()
		started := gated(t, g, func() func() {
			for range inFlight {
				begin <- struct{}{}
			}
			return func() {
				for range inFlight {
					require.NoError(t, <-answers)
				}
			}
		})
		// Without a worker free, each call starts one; a few may start for
		// other reasons (the runtime's, the transport's).
		assert.Less(t, started, uint64(inFlight*rounds/4))
	})

	t.Run("sluice", func(t *testing.T) {
		g, addr := start(t, "sluice")
		h := dialH2(t, addr)
		msgs := make([][]byte, inFlight)
		for i := range msgs {
			b, err := proto.Marshal(request(i))
			require.NoError(t, err)
			msgs[i] = append([]byte{0, 0, 0, 0, byte(len(b))}, b...) // a gRPC message under 256 bytes
		}
		id := uint32(1)
		started := gated(t, g, func() func() {
			first := id
			for range inFlight {
				h.open(id, shouldRateLimitPath)
				id += 2
			}
			for i := range inFlight {
				require.NoError(t, h.fr.WriteData(first+2*uint32(i), true, msgs[i]))
			}
			return func() {
				ids := make([]uint32, inFlight)
				for i := range ids {
					ids[i] = first + 2*uint32(i)
				}
				h.waitEnded(ids...)
				for _, i := range ids {
					assert.Equal(t, "0", h.ended[i].grpcStatus, "stream %d", i)
				}
			}
		})
		assert.Less(t, started, uint64(inFlight*rounds/4))
	})
}

// startGRPC runs a server of c with the gRPC API on loopback until t ends
// (then it must stop cleanly) and returns an RLS client of it. Register the
// store's Close before: cleanups run last first.
func startGRPC(t *testing.T, c service.Config) rlsv3.RateLimitServiceClient {
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- cli.RunServer(ctx, c, "127.0.0.1:0", c.Logger, nil,
			cli.WithGRPC("127.0.0.1:0", func(a net.Addr) { addr <- a.String() }))
	}()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	cc, err := grpc.NewClient(<-addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	return rlsv3.NewRateLimitServiceClient(cc)
}

// TestGRPCLeasesOnBothTransports: the Leases service, whose messages are
// JSON (content subtype "json", a codec registered the grpc-go v1 way),
// answers the same on the Sluice transport as on grpc-go.
func TestGRPCLeasesOnBothTransports(t *testing.T) {
	renew := func(transport string) string {
		addr := startGRPCConfig(t, service.Config{Store: store.NewMemory(), Default: store.Policy{Rate: 10, Burst: 10},
			Leases: &service.LeaseConfig{NoLearning: true}}, cli.GRPCLimits{Transport: transport})
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { cc.Close() })
		resp, err := leasegrpc.Transport(cc).Renew(context.Background(), &lease.Request{Holder: "h1",
			Keys: []lease.KeyRequest{{Key: "k"}}})
		if err != nil {
			return "error: " + err.Error()
		}
		require.Len(t, resp.Keys, 1)
		return fmt.Sprintf("rate=%v burst=%v", resp.Keys[0].Rate, resp.Keys[0].Burst)
	}
	want := renew("grpc-go")
	t.Log("grpc-go:", want)
	assert.Equal(t, want, renew("sluice"))
}

// TestGRPCTransportsAnswerAlike: calls answered by the Sluice transport
// get what grpc-go gives them: answers, status codes and messages, on one
// connection, including a method no service has and a health check.
func TestGRPCTransportsAnswerAlike(t *testing.T) {
	rc, err := rules.Parse("rules.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2}\n"))
	require.NoError(t, err)
	outcomes := func(transport string) []string {
		addr := startGRPCConfig(t, service.Config{Store: store.NewMemory(), Default: store.Policy{Rate: 10, Burst: 10}, Rules: rc},
			cli.GRPCLimits{Transport: transport})
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { cc.Close() })
		client := rlsv3.NewRateLimitServiceClient(cc)
		var out []string
		note := func(resp any, err error) {
			if err != nil {
				out = append(out, "error: "+err.Error())
				return
			}
			out = append(out, fmt.Sprint(resp))
		}
		desc := func(k, v string) []*ratelimitv3.RateLimitDescriptor {
			return []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: k, Value: v}}}}
		}
		for _, req := range []*rlsv3.RateLimitRequest{
			{Domain: "d", Descriptors: desc("k", "a")}, // the first call: the connection is the Sluice transport's
			{Domain: "d", Descriptors: desc("k", "a")},
			{Domain: "d", Descriptors: desc("k", "a")}, // over the limit
			{Domain: "d", Descriptors: desc("other", "x")},
			{Domain: "", Descriptors: desc("k", "a")},
			{Domain: "d"},
			{Domain: "d", Descriptors: desc("k", "é%\n")},
		} {
			resp, err := client.ShouldRateLimit(context.Background(), req)
			if resp != nil {
				for _, s := range resp.Statuses {
					s.DurationUntilReset = nil // a clock reading
				}
			}
			note(resp, err)
		}
		note(healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{}))
		var empty emptypb.Empty
		note(nil, cc.Invoke(context.Background(), "/no.Such/Method", &empty, &empty))
		return out
	}
	want := outcomes("grpc-go")
	got := outcomes("sluice")
	require.Len(t, got, len(want))
	for i := range want {
		assert.Equal(t, want[i], got[i], "outcome %d", i)
	}
}

// TestGRPCReflection: the gRPC port serves reflection (what grpcurl and
// ghz ask first), on either transport, and lists the services.
func TestGRPCReflection(t *testing.T) {
	for _, transport := range []string{"sluice", "grpc-go"} {
		addr := startGRPCLimits(t, cli.GRPCLimits{Transport: transport})
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { cc.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := reflectionpb.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
		require.NoError(t, err)
		require.NoError(t, s.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}))
		r, err := s.Recv()
		require.NoError(t, err)
		var names []string
		for _, svc := range r.GetListServicesResponse().GetService() {
			names = append(names, svc.GetName())
		}
		assert.Subset(t, names, []string{"envoy.service.ratelimit.v3.RateLimitService", "grpc.health.v1.Health", "sluice.lease.v1.Leases"}, transport)
		// A unary call after it, on the same connection (grpc-go's now).
		_, err = healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		require.NoError(t, err, transport)
	}
}
