package cli_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"runtime/metrics"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-go/sluice/cmd/sluice/internal/cli"
	"github.com/sluice-go/sluice/cmd/sluice/service"
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
	defer c.Store.Close()
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- cli.RunServer(ctx, c, "127.0.0.1:0", c.Logger, nil,
			cli.WithGRPC("127.0.0.1:0", func(a net.Addr) { addr <- a.String() }))
	}()
	defer func() { cancel(); require.NoError(t, <-done) }()
	cc, err := grpc.NewClient(<-addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer cc.Close()
	client := rlsv3.NewRateLimitServiceClient(cc)
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
