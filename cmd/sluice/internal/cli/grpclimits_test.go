package cli_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-go/sluice/cmd/sluice/internal/cli"
	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/store"
)

const shouldRateLimitPath = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// startGRPCLimits runs a server (memory store, no rules) whose gRPC port has
// the bounds lim until t ends, and returns the port's address.
func startGRPCLimits(t *testing.T, lim cli.GRPCLimits) string {
	t.Helper()
	return startGRPCConfig(t, service.Config{Store: store.NewMemory(), Default: store.Policy{Rate: 1000, Burst: 1000}}, lim)
}

// startGRPCConfig runs a server of c (its Logger discarding, its store
// closed at the end) whose gRPC port has the bounds lim until t ends, and
// returns the port's address.
func startGRPCConfig(t *testing.T, c service.Config, lim cli.GRPCLimits) string {
	t.Helper()
	c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	t.Cleanup(func() { c.Store.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- cli.RunServer(ctx, c, "127.0.0.1:0", c.Logger, nil,
			cli.WithGRPCLimits("127.0.0.1:0", lim, func(a net.Addr) { addr <- a.String() }))
	}()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	return <-addr
}

// h2Client speaks raw HTTP/2 to a gRPC port, to do what no well-behaved
// client does: open streams and never send their message.
type h2Client struct {
	t        *testing.T
	c        net.Conn
	fr       *http2.Framer
	enc      *hpack.Encoder
	hbuf     bytes.Buffer
	settings map[http2.SettingID]uint32 // the server's first SETTINGS
	ended    map[uint32]streamEnd
	synced   bool
	goAway   bool
}

// streamEnd is how the server ended a stream: with trailers (their
// grpc-status) or RST_STREAM.
type streamEnd struct {
	grpcStatus string // "" for none
	rst        bool
	rstCode    http2.ErrCode
}

func dialH2(t *testing.T, addr string) *h2Client {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	h := &h2Client{t: t, c: c, fr: http2.NewFramer(c, c), settings: map[http2.SettingID]uint32{}, ended: map[uint32]streamEnd{}}
	h.enc = hpack.NewEncoder(&h.hbuf)
	h.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	_, err = io.WriteString(c, http2.ClientPreface)
	require.NoError(t, err)
	require.NoError(t, h.fr.WriteSettings())
	for len(h.settings) == 0 { // the server's SETTINGS come first
		h.read()
	}
	return h
}

// open sends the HEADERS of a call to path on stream id, and no message.
func (h *h2Client) open(id uint32, path string, extra ...hpack.HeaderField) {
	h.t.Helper()
	h.hbuf.Reset()
	fields := append([]hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: path},
		{Name: ":authority", Value: "sluice"}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
	}, extra...)
	for _, f := range fields {
		require.NoError(h.t, h.enc.WriteField(f))
	}
	require.NoError(h.t, h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: h.hbuf.Bytes(), EndHeaders: true}))
}

// read reads one frame (failing the test if none comes within 10 s:
// before the bounds, the server never ended a half-open stream).
func (h *h2Client) read() {
	h.t.Helper()
	require.NoError(h.t, h.c.SetReadDeadline(time.Now().Add(10*time.Second)))
	f, err := h.fr.ReadFrame()
	require.NoError(h.t, err, "the server ended %d streams: %v", len(h.ended), h.ended)
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if !f.IsAck() {
			_ = f.ForeachSetting(func(s http2.Setting) error { h.settings[s.ID] = s.Val; return nil })
			if len(h.settings) == 0 {
				h.settings[0] = 0 // an empty SETTINGS still counts as received
			}
			require.NoError(h.t, h.fr.WriteSettingsAck())
		}
	case *http2.MetaHeadersFrame:
		if f.StreamEnded() {
			h.end(f.StreamID, streamEnd{grpcStatus: headerValue(f, "grpc-status")})
		}
	case *http2.RSTStreamFrame:
		h.end(f.StreamID, streamEnd{rst: true, rstCode: f.ErrCode})
	case *http2.GoAwayFrame:
		h.goAway = true
	case *http2.PingFrame:
		if f.IsAck() && f.Data == syncPing {
			h.synced = true
		}
	}
}

var syncPing = [8]byte{'s', 'l', 'u', 'i', 'c', 'e'}

// sync returns once the server has read every frame sent before: it
// answers a PING after the frames before it.
func (h *h2Client) sync() {
	h.t.Helper()
	h.synced = false
	require.NoError(h.t, h.fr.WritePing(false, syncPing))
	for !h.synced {
		h.read()
	}
}

func (h *h2Client) end(id uint32, e streamEnd) {
	if _, ok := h.ended[id]; !ok {
		h.ended[id] = e
	}
}

func headerValue(f *http2.MetaHeadersFrame, name string) string {
	for _, hf := range f.RegularFields() {
		if hf.Name == name {
			return hf.Value
		}
	}
	return ""
}

// waitEnded reads frames until the server has ended every stream of ids.
func (h *h2Client) waitEnded(ids ...uint32) {
	h.t.Helper()
	for {
		missing := false
		for _, id := range ids {
			if _, ok := h.ended[id]; !ok {
				missing = true
			}
		}
		if !missing {
			return
		}
		h.read()
	}
}

// TestGRPCStreamsPerConnection: the gRPC port advertises a cap on
// concurrent streams per connection, and refuses a stream past it
// (REFUSED_STREAM, which a client may retry elsewhere), however long the
// streams under the cap stay open.
func TestGRPCStreamsPerConnection(t *testing.T) {
	addr := startGRPCLimits(t, cli.GRPCLimits{MaxStreams: 4, RecvTimeout: time.Minute})
	h := dialH2(t, addr)
	assert.Equal(t, uint32(4), h.settings[http2.SettingMaxConcurrentStreams], "SETTINGS_MAX_CONCURRENT_STREAMS")
	for id := uint32(1); id <= 9; id += 2 { // five streams, none sends its message
		h.open(id, shouldRateLimitPath)
	}
	h.waitEnded(9)
	assert.Equal(t, streamEnd{rst: true, rstCode: http2.ErrCodeRefusedStream}, h.ended[9])
	for id := uint32(1); id <= 7; id += 2 {
		assert.NotContains(t, h.ended, id, "a stream under the cap")
	}
}

// TestGRPCHalfOpenStreamsEnd: streams that send their headers and never a
// message are ended at RecvTimeout (DEADLINE_EXCEEDED), whatever deadline
// the client asked for, and the goroutines that waited for them are freed.
func TestGRPCHalfOpenStreamsEnd(t *testing.T) {
	const recvTimeout = 200 * time.Millisecond
	addr := startGRPCLimits(t, cli.GRPCLimits{MaxStreams: 1000, RecvTimeout: recvTimeout})
	h := dialH2(t, addr)
	before := runtime.NumGoroutine()
	const n = 200
	var ids []uint32
	start := time.Now()
	for i := range n {
		id := uint32(2*i + 1)
		var extra []hpack.HeaderField
		if i%2 == 1 { // a client asking for an hour gets RecvTimeout too
			extra = append(extra, hpack.HeaderField{Name: "grpc-timeout", Value: "1H"})
		}
		h.open(id, shouldRateLimitPath, extra...)
		ids = append(ids, id)
	}
	h.waitEnded(ids...)
	assert.GreaterOrEqual(t, time.Since(start), recvTimeout, "ended before the deadline")
	for _, id := range ids {
		assert.Equal(t, strconv.Itoa(int(codes.DeadlineExceeded)), h.ended[id].grpcStatus, "stream %d: %+v", id, h.ended[id])
	}
	// The handlers' goroutines are gone (a few may come and go for the
	// runtime's or the transport's own reasons).
	require.Eventually(t, func() bool { return runtime.NumGoroutine() <= before+5 }, 10*time.Second, 10*time.Millisecond,
		"goroutines: %d before the streams", before)
}

// TestGRPCHealthWatchOutlivesRecvTimeout: the receive deadline bounds a
// stream until its request has arrived, not a health Watch after it: a
// watch opened before a half-open stream is cut is still served after.
func TestGRPCHealthWatchOutlivesRecvTimeout(t *testing.T) {
	const recvTimeout = 200 * time.Millisecond
	addr := startGRPCLimits(t, cli.GRPCLimits{RecvTimeout: recvTimeout})
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := healthpb.NewHealthClient(cc).Watch(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	r, err := w.Recv()
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, r.Status)
	// A half-open watch (no request) is cut at the deadline, which proves
	// that the first one has lived past its own.
	h := dialH2(t, addr)
	h.open(1, "/grpc.health.v1.Health/Watch")
	h.waitEnded(1)
	assert.Equal(t, strconv.Itoa(int(codes.Canceled)), h.ended[1].grpcStatus, "%+v", h.ended[1])
	// The first watch is still open: a health check on its connection
	// still works and its stream has not ended (it ends when we cancel).
	_, err = healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	recvd := make(chan error, 1)
	go func() { _, err := w.Recv(); recvd <- err }()
	cancel()
	assert.Equal(t, codes.Canceled, status.Code(<-recvd), "the watch ended by our cancel, not before")
}

// TestGRPCIdleConnectionClosed: a connection without streams for
// IdleTimeout is closed (GOAWAY, then EOF), as the HTTP port's IdleTimeout
// closes one.
func TestGRPCIdleConnectionClosed(t *testing.T) {
	const idle = 300 * time.Millisecond
	addr := startGRPCLimits(t, cli.GRPCLimits{IdleTimeout: idle})
	h := dialH2(t, addr)
	start := time.Now()
	h.sync()
	for {
		require.NoError(t, h.c.SetReadDeadline(time.Now().Add(10*time.Second)))
		f, err := h.fr.ReadFrame()
		if err != nil {
			require.ErrorIs(t, err, io.EOF, "the server closes the connection")
			break
		}
		switch f := f.(type) {
		case *http2.GoAwayFrame:
			h.goAway = true
			assert.Equal(t, http2.ErrCodeNo, f.ErrCode)
		case *http2.PingFrame: // a graceful GOAWAY waits for a PING's answer
			if !f.IsAck() {
				_ = h.fr.WritePing(true, f.Data)
			}
		}
	}
	assert.True(t, h.goAway, "GOAWAY before closing")
	assert.GreaterOrEqual(t, time.Since(start), idle)
}

// TestGRPCMaxRequestSize: a request up to MaxRequestBytes is answered; a
// larger one gets RESOURCE_EXHAUSTED.
func TestGRPCMaxRequestSize(t *testing.T) {
	addr := startGRPCLimits(t, cli.GRPCLimits{})
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	client := rlsv3.NewRateLimitServiceClient(cc)
	req := func(size int) *rlsv3.RateLimitRequest {
		r := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: ""}}}}}
		for v := size - proto.Size(r); proto.Size(r) != size; v -= proto.Size(r) - size {
			r.Descriptors[0].Entries[0].Value = strings.Repeat("v", v)
		}
		require.Equal(t, size, proto.Size(r))
		return r
	}
	_, err = client.ShouldRateLimit(context.Background(), req(cli.DefaultGRPCMaxRequestBytes))
	require.NoError(t, err, "a request of the largest size")
	_, err = client.ShouldRateLimit(context.Background(), req(cli.DefaultGRPCMaxRequestBytes+1))
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	_, err = client.ShouldRateLimit(context.Background(), req(4<<20-64))
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
}

// TestGRPCInFlightBytes: streams in flight, server-wide and counted at
// MaxRequestBytes each, stay within InFlightBytes: past it a new stream,
// on any connection, gets RESOURCE_EXHAUSTED at once; once the streams
// holding the budget end, calls are answered again.
func TestGRPCInFlightBytes(t *testing.T) {
	const size = 64 << 10
	addr := startGRPCLimits(t, cli.GRPCLimits{MaxStreams: 100, MaxRequestBytes: size, InFlightBytes: 4 * size, RecvTimeout: time.Minute})
	a := dialH2(t, addr)
	for id := uint32(1); id <= 7; id += 2 {
		a.open(id, shouldRateLimitPath)
	}
	a.sync() // the server has admitted a's streams
	b := dialH2(t, addr)
	b.open(1, shouldRateLimitPath)
	b.waitEnded(1)
	assert.Equal(t, strconv.Itoa(int(codes.ResourceExhausted)), b.ended[1].grpcStatus, "%+v", b.ended[1])
	assert.Empty(t, a.ended, "the streams under the budget are still open")

	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	client := rlsv3.NewRateLimitServiceClient(cc)
	call := func() error {
		_, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
		return err
	}
	require.Equal(t, codes.ResourceExhausted, status.Code(call()))
	for id := uint32(1); id <= 7; id += 2 { // the client gives up its streams
		require.NoError(t, a.fr.WriteRSTStream(id, http2.ErrCodeCancel))
	}
	require.Eventually(t, func() bool {
		err := call()
		if err != nil && status.Code(err) != codes.ResourceExhausted {
			t.Fatal(err)
		}
		return err == nil
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, call())
}

// TestGRPCTransportsSendTheSameSettings: the sluice transport sends its
// SETTINGS before it knows whether it keeps a connection, and grpc-go sends
// its own when it takes one over; the two must agree, so that the second
// changes nothing the client already relies on.
func TestGRPCTransportsSendTheSameSettings(t *testing.T) {
	for _, lim := range []cli.GRPCLimits{{}, {MaxStreams: 7, MaxRequestBytes: 1 << 20, InFlightBytes: 1 << 20}} {
		goLim, ours := lim, lim
		goLim.Transport, ours.Transport = "grpc-go", "sluice"
		want := dialH2(t, startGRPCLimits(t, goLim)).settings
		got := dialH2(t, startGRPCLimits(t, ours)).settings
		assert.Equal(t, want, got, "%+v", lim)
	}
}
