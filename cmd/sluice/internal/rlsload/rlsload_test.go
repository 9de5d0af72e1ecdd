package rlsload_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-go/sluice/cmd/sluice/internal/cli"
	"github.com/sluice-go/sluice/cmd/sluice/internal/rlsload"
	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
	"github.com/sluice-go/sluice/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serveRLS runs the service's gRPC listener (cli.WithGRPC, as `sluice serve
// -grpc -config`) on loopback under rules, memory store, and returns its
// address.
func serveRLS(t *testing.T, yaml string) string {
	t.Helper()
	rc, err := rules.Parse("rules.yaml", []byte(yaml))
	require.NoError(t, err)
	st := store.NewMemory()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c := service.Config{Store: st, Default: store.Policy{Rate: 1000, Burst: 1000}, Rules: rc,
		StoreTimeout: 5 * time.Second, Logger: log}
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- cli.RunServer(ctx, c, "127.0.0.1:0", log, nil,
			cli.WithGRPC("127.0.0.1:0", func(a net.Addr) { addr <- a.String() }))
	}()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done); st.Close() })
	return <-addr
}

func request(t *testing.T, domain string, kv ...string) []byte {
	t.Helper()
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	b, err := proto.Marshal(&rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
	require.NoError(t, err)
	return b
}

const tenPerMinute = "domain: t\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"

// The run counts the server's decisions: a bucket of 10 a minute answers
// exactly 10 OK and the rest OVER_LIMIT, however the calls spread over
// connections and streams.
func TestRunCountsDecisions(t *testing.T) {
	addr := serveRLS(t, tenPerMinute)
	for _, c := range []struct{ conns, streams int }{{1, 1}, {2, 4}, {4, 16}} {
		key := "ann" + strconv.Itoa(c.conns*100+c.streams)
		r, err := rlsload.Run(context.Background(), rlsload.Config{Addr: addr, Conns: c.conns, Streams: c.streams,
			Requests: [][]byte{request(t, "t", "user", key)}, Calls: 100})
		require.NoError(t, err)
		assert.Equal(t, 10, r.OK, "%+v", c)
		assert.Equal(t, 90, r.OverLimit, "%+v", c)
		assert.Equal(t, map[int]int{0: 100}, r.Status, "%+v", c)
		assert.Zero(t, r.Failed, "%+v", c)
		assert.Positive(t, r.Quantile(0.5))
	}
}

// A call the server refuses (an empty domain: InvalidArgument, in a
// trailers-only answer) is counted by its grpc-status, not as a decision.
func TestRunCountsRefusals(t *testing.T) {
	addr := serveRLS(t, tenPerMinute)
	r, err := rlsload.Run(context.Background(), rlsload.Config{Addr: addr, Conns: 2, Streams: 3,
		Requests: [][]byte{request(t, "t", "user", "bob"), request(t, "", "user", "bob")}, Calls: 40})
	require.NoError(t, err)
	assert.Equal(t, 10, r.OK)
	assert.Equal(t, 10, r.OverLimit)
	assert.Equal(t, map[int]int{0: 20, 3: 20}, r.Status)
	assert.Zero(t, r.Failed)
}

// A run for a duration ends, every call in flight answered, each key its
// own bucket.
func TestRunForDuration(t *testing.T) {
	addr := serveRLS(t, "domain: t\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n")
	reqs := make([][]byte, 100)
	for i := range reqs {
		reqs[i] = request(t, "t", "user", "u"+strconv.Itoa(i))
	}
	r, err := rlsload.Run(context.Background(), rlsload.Config{Addr: addr, Requests: reqs, Duration: 100 * time.Millisecond})
	require.NoError(t, err)
	assert.Positive(t, r.OK)
	assert.Zero(t, r.OverLimit)
	assert.Equal(t, map[int]int{0: r.OK}, r.Status)
	assert.Zero(t, r.Failed)
}

type fixed struct {
	rlsv3.UnimplementedRateLimitServiceServer
	resp *rlsv3.RateLimitResponse
}

func (f fixed) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return f.resp, nil
}

// The answer's overall_code is decoded: UNKNOWN (a server that decided
// nothing) is not a decision; other fields are skipped.
func TestRunDecodesOverallCode(t *testing.T) {
	for _, c := range []struct {
		resp     *rlsv3.RateLimitResponse
		ok, over int
	}{
		{&rlsv3.RateLimitResponse{}, 0, 0},
		{&rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OVER_LIMIT, LimitRemaining: 7}}}, 0, 5},
		{&rlsv3.RateLimitResponse{Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{LimitRemaining: 7}},
			OverallCode: rlsv3.RateLimitResponse_OK, RawBody: []byte("x")}, 5, 0},
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		g := grpc.NewServer()
		rlsv3.RegisterRateLimitServiceServer(g, fixed{resp: c.resp})
		done := make(chan struct{})
		go func() { _ = g.Serve(ln); close(done) }()
		r, err := rlsload.Run(context.Background(), rlsload.Config{Addr: ln.Addr().String(),
			Requests: [][]byte{request(t, "t", "user", "x")}, Calls: 5})
		g.Stop()
		<-done
		require.NoError(t, err)
		assert.Equal(t, c.ok, r.OK)
		assert.Equal(t, c.over, r.OverLimit)
		assert.Equal(t, map[int]int{0: 5}, r.Status)
		assert.Zero(t, r.Failed)
	}
}
