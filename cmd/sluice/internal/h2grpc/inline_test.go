package h2grpc_test

import (
	"bytes"
	"context"
	"net"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-go/sluice/cmd/sluice/internal/h2grpc"
)

// whereService's Where answers where its handler ran: "reader" when on a
// connection's reading goroutine, "worker" otherwise; Hold reports on
// entered, then waits for release.
type whereService struct {
	entered chan string
	release chan struct{}
}

func whereHandler(ctx context.Context, in *wrapperspb.StringValue) string {
	if strings.Contains(string(debug.Stack()), "h2grpc.(*conn).serve(") {
		return "reader"
	}
	return "worker"
}

var whereDesc = grpc.ServiceDesc{
	ServiceName: "sluice.test.Where",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		unary("Where", func(_ *testService, ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
			return wrapperspb.String(whereHandler(ctx, in)), nil
		}),
	},
}

var holdDesc = grpc.ServiceDesc{
	ServiceName: "sluice.test.Hold",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{MethodName: "Hold", Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
		in := new(wrapperspb.StringValue)
		if err := dec(in); err != nil {
			return nil, err
		}
		s := srv.(*whereService)
		s.entered <- whereHandler(ctx, in) + " " + in.Value
		<-s.release
		return in, nil
	}}},
}

// serveWhere serves whereDesc (with a testService, as unary wants) and
// holdDesc on a server of cfg until the test ends.
func serveWhere(t *testing.T, cfg h2grpc.Config) (string, *whereService) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cfg.Log = discardLog()
	s := h2grpc.New(cfg, 4)
	s.RegisterService(&whereDesc, newTestService())
	hs := &whereService{entered: make(chan string, 4), release: make(chan struct{})}
	s.RegisterService(&holdDesc, hs)
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln, nil) }()
	t.Cleanup(func() {
		close(hs.release)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, s.Shutdown(ctx))
		require.ErrorIs(t, <-served, h2grpc.ErrServerClosed)
	})
	return ln.Addr().String(), hs
}

// TestInlineRunsOnTheReader: with Config.Inline a call runs on its
// connection's reader; without, on a worker.
func TestInlineRunsOnTheReader(t *testing.T) {
	for _, inline := range []bool{true, false} {
		addr, _ := serveWhere(t, h2grpc.Config{Inline: inline})
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { cc.Close() })
		for range 3 {
			got, err := call(context.Background(), cc, "/sluice.test.Where/Where", "")
			require.NoError(t, err)
			assert.Equal(t, map[bool]string{true: "reader", false: "worker"}[inline], got, "Inline %v", inline)
		}
	}
}

// TestInlineAlone: with Config.InlineAlone a call alone on its connection
// runs on the reader, and calls read together run on workers, at once
// (both handlers hold at the same time: inline, the second would wait).
func TestInlineAlone(t *testing.T) {
	addr, hs := serveWhere(t, h2grpc.Config{InlineAlone: true})
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	var out bytes.Buffer
	fr := http2.NewFramer(&out, nil)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	headers := func(id uint32) {
		hb.Reset()
		for _, f := range []hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
			{Name: ":path", Value: "/sluice.test.Hold/Hold"}, {Name: ":authority", Value: "x"}, {Name: "content-type", Value: "application/grpc"}} {
			require.NoError(t, enc.WriteField(f))
		}
		require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true}))
	}
	out.WriteString(http2.ClientPreface)
	require.NoError(t, fr.WriteSettings())
	headers(1)
	require.NoError(t, fr.WriteData(1, true, msg("a")))
	headers(3)
	require.NoError(t, fr.WriteData(3, true, msg("b")))
	_, err = c.Write(out.Bytes()) // one write: the server reads both calls together
	require.NoError(t, err)
	got := []string{<-hs.entered, <-hs.entered}
	assert.ElementsMatch(t, []string{"worker a", "worker b"}, got)

	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	got1, err := call(context.Background(), cc, "/sluice.test.Where/Where", "")
	require.NoError(t, err)
	assert.Equal(t, "reader", got1, "a call alone on its connection")
}

// TestInlineShutdownMidBatch: with Config.Inline, calls read together run
// on the reader with their answers held until the last is written; a
// Shutdown that comes meanwhile closes the connection after them, with the
// held answers and its GOAWAY sent first, not dropped.
func TestInlineShutdownMidBatch(t *testing.T) {
	conns := make(chan *brokenConn, 1)
	f := start(t, h2grpc.Config{Inline: true, RecvTimeout: time.Minute},
		fixtureOpt{wrap: func(c net.Conn) net.Conn { b := &brokenConn{Conn: c}; conns <- b; return b }})
	r := fastRaw(t, f)
	bc := <-conns
	var out bytes.Buffer
	fr := http2.NewFramer(&out, nil)
	require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: r.block(blockPath), EndHeaders: true}))
	require.NoError(t, fr.WriteData(3, true, msg("held")))
	require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 5, BlockFragment: r.block(echoPath), EndHeaders: true}))
	require.NoError(t, fr.WriteData(5, true, msg("after")))
	bc.want.Store(int64(out.Len())) // both calls read together: one batch
	_, err := r.c.Write(out.Bytes())
	require.NoError(t, err)
	require.Equal(t, "held", <-f.svc.started)

	shut := make(chan error, 1)
	go func() { shut <- f.srv.Shutdown(context.Background()) }()
	// Shutdown's wait has begun once its goroutine runs, and the GOAWAY is
	// written (held with the batch) once no goAway runs.
	require.Eventually(t, func() bool {
		return goroutinesIn("h2grpc.(*Server).Shutdown.func") > 0 && goroutinesIn("h2grpc.(*conn).goAway(") == 0 &&
			goroutinesIn("h2grpc.(*Server).Shutdown.gowrap") == 0 // go c.goAway() not yet in goAway
	}, 10*time.Second, time.Millisecond)
	f.svc.releaseAll()
	assert.Equal(t, 0, r.ended(3).status())
	assert.Equal(t, 0, r.ended(5).status())
	g := r.closed()
	require.NotNil(t, g, "a GOAWAY before the close")
	assert.Equal(t, goAway{http2.ErrCodeNo, 5, ""}, *g)
	require.NoError(t, <-shut)
}
