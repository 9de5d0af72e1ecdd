package cli_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-go/sluice/cmd/sluice/internal/cli"
	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
	"github.com/sluice-go/sluice/store"
)

// TestGRPCNoFlowControlPings: a call on a connection that carries one call
// at a time (as Envoy's) costs the server no frames beyond its answer:
// no PING (grpc-go's bandwidth estimator, on by default, sends one with a
// WINDOW_UPDATE on about every call's request data) and no WINDOW_UPDATE,
// over raw HTTP/2 so that nothing the client does is hidden.
func TestGRPCNoFlowControlPings(t *testing.T) {
	rc, err := rules.Parse("t.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1000}\n"))
	require.NoError(t, err)
	mem := store.NewMemory()
	t.Cleanup(func() { mem.Close() })
	c := service.Config{Store: mem, Default: store.Policy{Rate: 10, Burst: 10}, Rules: rc,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- cli.RunServer(ctx, c, "127.0.0.1:0", c.Logger, nil,
			cli.WithGRPC("127.0.0.1:0", func(a net.Addr) { addr <- a.String() }))
	}()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })

	nc, err := net.Dial("tcp", <-addr)
	require.NoError(t, err)
	defer nc.Close()
	// A deadline only so that a broken server fails the test, not hangs it.
	require.NoError(t, nc.SetDeadline(time.Now().Add(time.Minute)))
	fr := http2.NewFramer(nc, nc)
	_, err = io.WriteString(nc, http2.ClientPreface)
	require.NoError(t, err)
	require.NoError(t, fr.WriteSettings())

	msg, err := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
	require.NoError(t, err)
	body := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg))) // gRPC message prefix
	body = append(body, msg...)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	pings, updates := 0, 0
	const calls = 8
	for i := range calls {
		id := uint32(2*i + 1)
		hb.Reset()
		for _, f := range []hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
			{Name: ":path", Value: "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"},
			{Name: ":authority", Value: "sluice"}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"}} {
			require.NoError(t, enc.WriteField(f))
		}
		require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true}))
		require.NoError(t, fr.WriteData(id, true, body))
		answered := false
		for !answered { // until the call's trailers
			f, err := fr.ReadFrame()
			require.NoError(t, err)
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					require.NoError(t, fr.WriteSettingsAck())
				}
			case *http2.PingFrame:
				if !f.IsAck() {
					pings++
					require.NoError(t, fr.WritePing(true, f.Data))
				}
			case *http2.WindowUpdateFrame:
				// The server's own first one (raising the connection's
				// window past the default) is not a call's.
				if i > 0 {
					updates++
				}
			case *http2.RSTStreamFrame:
				t.Fatalf("call %d reset: %v", i, f.ErrCode)
			case *http2.HeadersFrame:
				answered = f.StreamID == id && f.StreamEnded()
			}
		}
	}
	require.Zero(t, pings, "PING frames the server sent over %d calls", calls)
	require.Zero(t, updates, "WINDOW_UPDATE frames the server sent over calls 2 to %d", calls)
}
