package service_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
	"github.com/sluice-go/sluice/store"
)

// Serving Envoy's rate-limit protocol from your own program: rules in
// envoyproxy/ratelimit's format, a memory store, and the generated gRPC
// client asking as Envoy would.
func ExampleServer_RegisterRateLimitService() {
	rs, err := rules.Parse("ratelimit.yaml", []byte(`
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
`))
	if err != nil {
		panic(err)
	}
	mem := store.NewMemory()
	defer mem.Close()
	srv, err := service.New(service.Config{Store: mem, Default: store.Policy{Rate: 10, Burst: 10}, Rules: rs,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}
	g := grpc.NewServer()
	srv.RegisterRateLimitService(g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go func() { _ = g.Serve(ln) }()
	defer g.Stop()

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "198.51.100.7"}},
	}}}
	for range 3 {
		r, err := client.ShouldRateLimit(context.Background(), req)
		if err != nil {
			panic(err)
		}
		st := r.Statuses[0]
		fmt.Println(r.OverallCode, st.LimitRemaining, st.CurrentLimit.RequestsPerUnit, st.CurrentLimit.Unit,
			st.DurationUntilReset.AsDuration().Round(10*time.Second))
	}
	// Output:
	// OK 1 2 MINUTE 30s
	// OK 0 2 MINUTE 1m0s
	// OVER_LIMIT 0 2 MINUTE 30s
}
