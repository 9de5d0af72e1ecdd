package h2grpc_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-go/sluice/cmd/sluice/internal/h2grpc"
)

// TestUnaryCalls: a grpc-go client's unary calls, many at once on one
// connection, are answered by h2grpc (not handed over), small and large.
func TestUnaryCalls(t *testing.T) {
	f := start(t, h2grpc.Config{}, fixtureOpt{handoff: true, workers: 4})
	cc := f.client()
	ctx := context.Background()
	who, err := call(ctx, cc, whoPath, "")
	require.NoError(t, err)
	assert.Equal(t, "h2grpc/insecure", who, "the first call is unary: h2grpc keeps the connection")

	var wg sync.WaitGroup
	errs := make(chan error, 400)
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				v := fmt.Sprintf("call %d/%d", g, i)
				out, err := call(ctx, cc, echoPath, v)
				if err == nil && out != v {
					err = fmt.Errorf("echo of %q answered %q", v, out)
				}
				if err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assert.Equal(t, int64(400), f.svc.echoCalls.Load())

	// A request near MaxRequestBytes (64 KiB by default) and its answer.
	v := strings.Repeat("y", 60000)
	out, err := call(ctx, cc, echoPath, v)
	require.NoError(t, err)
	assert.Equal(t, v, out)
}

// TestLargeAnswer: an answer bigger than the client's first windows
// arrives whole. A grpc-go client pings (BDP estimation) as DATA arrives
// and while it waits for more; those pings must not count as a ping flood,
// as grpc-go's own server resets its strikes on each DATA frame it writes.
func TestLargeAnswer(t *testing.T) {
	f := start(t, h2grpc.Config{}, fixtureOpt{})
	cc := f.client()
	for _, n := range []int{300000, 1 << 20} {
		big, err := call(context.Background(), cc, bigPath, strconv.Itoa(n))
		require.NoError(t, err, "an answer of %d bytes", n)
		assert.Equal(t, strings.Repeat("x", n), big)
	}
}

// TestStatusError: a handler's status error reaches the client with its
// code and message, non-ASCII bytes and '%' intact (percent-encoded on the
// wire); a message past 1024 bytes is cut there.
func TestStatusError(t *testing.T) {
	f := start(t, h2grpc.Config{}, fixtureOpt{})
	cc := f.client()
	for _, m := range []string{"plain", "100% sûr, 日本語 ✓", "%41 is not A", "tab\tand\nnewline", "\x7f\x00"} {
		_, err := call(context.Background(), cc, failPath, m)
		s := status.Convert(err)
		assert.Equal(t, codes.FailedPrecondition, s.Code(), m)
		assert.Equal(t, m, s.Message())
	}
	long := strings.Repeat("é", 1000) // 2000 bytes
	_, err := call(context.Background(), cc, failPath, long)
	assert.Equal(t, long[:1024], status.Convert(err).Message())
}

// TestDeadlines: the client's grpc-timeout reaches the handler's ctx, and
// RecvTimeout caps a longer one.
func TestDeadlines(t *testing.T) {
	f := start(t, h2grpc.Config{RecvTimeout: 5 * time.Second}, fixtureOpt{})
	cc := f.client()

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err := call(ctx, cc, echoPath, "a")
	require.NoError(t, err)
	d := <-f.svc.deadline
	assert.LessOrEqual(t, d, 3*time.Second)
	assert.Greater(t, d, 2*time.Second)

	ctx, cancel = context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	_, err = call(ctx, cc, echoPath, "b")
	require.NoError(t, err)
	d = <-f.svc.deadline
	assert.LessOrEqual(t, d, 5*time.Second, "RecvTimeout caps the client's hour")
	assert.Greater(t, d, 4*time.Second)

	_, err = call(context.Background(), cc, echoPath, "c") // no grpc-timeout: RecvTimeout
	require.NoError(t, err)
	d = <-f.svc.deadline
	assert.LessOrEqual(t, d, 5*time.Second)
	assert.Greater(t, d, 4*time.Second)
}

// TestClientCancel: a client's cancel (RST_STREAM CANCEL) cancels the
// handler's ctx.
func TestClientCancel(t *testing.T) {
	f := start(t, h2grpc.Config{}, fixtureOpt{})
	cc := f.client()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := call(ctx, cc, blockPath, "cancel me"); done <- err }()
	require.Equal(t, "cancel me", <-f.svc.started)
	cancel()
	assert.Equal(t, codes.Canceled, status.Code(<-done))
	assert.ErrorIs(t, <-f.svc.ctxErr, context.Canceled, "the handler's ctx")
	// The connection still serves.
	out, err := call(context.Background(), cc, echoPath, "after")
	require.NoError(t, err)
	assert.Equal(t, "after", out)
}

func openStream(t *testing.T, cc *grpc.ClientConn) grpc.ClientStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cs, err := cc.NewStream(ctx, &testDesc.Streams[0], streamPath)
	require.NoError(t, err)
	return cs
}

func streamWho(t *testing.T, cs grpc.ClientStream) (string, error) {
	t.Helper()
	// Why io.EOF is not the answer: grpc-go's SendMsg returns io.EOF when
	// the stream has ended (here: the connection closed under it), and the
	// stream's status is then RecvMsg's to report.
	if err := cs.SendMsg(wrapperspb.String("who")); err != nil && err != io.EOF {
		return "", err
	}
	out := new(wrapperspb.StringValue)
	err := cs.RecvMsg(out)
	return out.Value, err
}

// TestHandoffStreamingFirst: a connection whose first call streams is
// served by grpc-go, its later unary calls too.
func TestHandoffStreamingFirst(t *testing.T) {
	for _, tlsOn := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", tlsOn), func(t *testing.T) {
			f := start(t, h2grpc.Config{}, fixtureOpt{handoff: true, tls: tlsOn})
			auth := "insecure"
			if tlsOn {
				auth = "tls:TLS 1.3"
			}
			cc := f.client()
			cs := openStream(t, cc)
			w, err := streamWho(t, cs)
			require.NoError(t, err)
			assert.Equal(t, "grpc-go/"+auth, w)
			require.NoError(t, cs.CloseSend())
			require.ErrorIs(t, cs.RecvMsg(new(wrapperspb.StringValue)), io.EOF)

			w, err = call(context.Background(), cc, whoPath, "")
			require.NoError(t, err)
			assert.Equal(t, "grpc-go/"+auth, w, "a unary call on the handed-over connection")
			out, err := call(context.Background(), cc, bigPath, "100000")
			require.NoError(t, err)
			assert.Len(t, out, 100000)

			// Another connection starting with a unary call stays with h2grpc,
			// and its handler sees the TLS state too.
			cc2 := f.client()
			w, err = call(context.Background(), cc2, whoPath, "")
			require.NoError(t, err)
			fast := "h2grpc/insecure"
			if tlsOn {
				fast = "h2grpc/tls:TLS 1.3"
			}
			assert.Equal(t, fast, w)
		})
	}
}

// TestHandoffUnknownFirst: a connection whose first call names a method
// h2grpc does not serve goes to grpc-go, which answers it, then serves the
// connection's unary calls.
func TestHandoffUnknownFirst(t *testing.T) {
	f := start(t, h2grpc.Config{}, fixtureOpt{handoff: true})
	cc := f.client()
	err := cc.Invoke(context.Background(), "/nope.Nope/Nothing", wrapperspb.String(""), new(wrapperspb.StringValue))
	s := status.Convert(err)
	assert.Equal(t, codes.Unimplemented, s.Code())
	assert.Equal(t, "unknown service nope.Nope", s.Message(), "grpc-go's own answer")
	w, err := call(context.Background(), cc, whoPath, "")
	require.NoError(t, err)
	assert.Equal(t, "grpc-go/insecure", w)
}

// TestStreamingOnFastConnection: a streaming call on a connection h2grpc
// kept is answered UNIMPLEMENTED, saying to use a connection of its own.
func TestStreamingOnFastConnection(t *testing.T) {
	f := start(t, h2grpc.Config{}, fixtureOpt{handoff: true})
	cc := f.client()
	_, err := call(context.Background(), cc, echoPath, "first")
	require.NoError(t, err)
	_, err = streamWho(t, openStream(t, cc))
	s := status.Convert(err)
	assert.Equal(t, codes.Unimplemented, s.Code())
	assert.Equal(t, "sluice: "+streamPath+" streams: call it on a connection of its own (this one serves unary calls)", s.Message())
	err = cc.Invoke(context.Background(), "/nope.Nope/Nothing", wrapperspb.String(""), new(wrapperspb.StringValue))
	assert.Equal(t, status.New(codes.Unimplemented, "unknown service nope.Nope"), status.Convert(err))
}

// TestHandoffPingFirst: a connection that pings before any call is handed
// over at once (its ping needs an answer), and grpc-go answers the ping and
// the calls after it.
func TestHandoffPingFirst(t *testing.T) {
	f := start(t, h2grpc.Config{}, fixtureOpt{handoff: true})
	r := dialRaw(t, f.addr)
	require.NoError(t, r.fr.WritePing(false, syncData))
	r.until(func() bool { return r.pingAcks == 1 })
	r.unaryCall(1, whoPath, "")
	s := r.ended(1)
	require.Equal(t, 0, s.status())
	var out wrapperspb.StringValue
	require.GreaterOrEqual(t, len(s.data), 5)
	require.NoError(t, proto.Unmarshal(s.data[5:], &out))
	assert.Equal(t, "grpc-go/insecure", out.Value)
}

// TestNoHandoffCloses: without Handoff a connection h2grpc does not serve
// is closed (after the server's SETTINGS), with nothing else sent.
func TestNoHandoffCloses(t *testing.T) {
	f := start(t, h2grpc.Config{}, fixtureOpt{})
	r := dialRaw(t, f.addr)
	r.open(1, streamPath, false)
	assert.Nil(t, r.closed())
	require.Len(t, r.frames, 1)
	assert.Equal(t, http2.FrameSettings, r.frames[0].typ)

	cc := f.client()
	_, err := streamWho(t, openStream(t, cc))
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
}

// TestShutdown: Shutdown sends GOAWAY naming the last stream, refuses
// streams after it, lets the call in flight finish and its answer arrive,
// closes the connection after, and Serve returns ErrServerClosed.
func TestShutdown(t *testing.T) {
	f := start(t, h2grpc.Config{}, fixtureOpt{workers: 2})
	r := dialRaw(t, f.addr)
	r.unaryCall(1, echoPath, "warm")
	require.Equal(t, 0, r.ended(1).status())
	r.unaryCall(3, blockPath, "in flight")
	require.Equal(t, "in flight", <-f.svc.started)

	shut := make(chan error, 1)
	go func() { shut <- f.srv.Shutdown(context.Background()) }()
	r.until(func() bool { return r.goAway != nil })
	assert.Equal(t, goAway{http2.ErrCodeNo, 3, ""}, *r.goAway)
	r.unaryCall(5, echoPath, "late")
	require.Equal(t, http2.ErrCodeRefusedStream, *r.ended(5).rst)
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned (%v) with a call in flight", err)
	default:
	}

	f.svc.releaseAll()
	s := r.ended(3)
	assert.Equal(t, 0, s.status())
	assert.Equal(t, msg("in flight"), s.data)
	r.closed()
	assert.True(t, r.eof)
	require.NoError(t, <-shut)

	// A connection after Shutdown is closed at once.
	// A connection after Shutdown is refused, or closed at once.
	if c, err := net.Dial("tcp", f.addr); err == nil {
		defer c.Close()
		require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
		got, _ := io.ReadAll(c) // EOF or a reset: either way nothing sent
		assert.Empty(t, got)
	}

	f.ln.Close() // an error if Shutdown closed it already
	err := <-f.served
	assert.ErrorIs(t, err, h2grpc.ErrServerClosed)
	f.served <- err // for the cleanup
}

// TestCloseCancelsCalls: Close ends the connections at once, cancelling
// the handlers in flight.
func TestCloseCancelsCalls(t *testing.T) {
	f := start(t, h2grpc.Config{}, fixtureOpt{})
	cc := f.client()
	done := make(chan error, 1)
	go func() { _, err := call(context.Background(), cc, blockPath, "x"); done <- err }()
	<-f.svc.started
	f.srv.Close()
	assert.ErrorIs(t, <-f.svc.ctxErr, context.Canceled)
	assert.Equal(t, codes.Unavailable, status.Code(<-done))
}

// TestManyConnections: calls on many connections at once, each its own
// client.
func TestManyConnections(t *testing.T) {
	f := start(t, h2grpc.Config{}, fixtureOpt{workers: 2})
	var wg sync.WaitGroup
	for i := range 20 {
		cc := f.client()
		wg.Go(func() {
			for j := range 10 {
				v := strconv.Itoa(i*100 + j)
				out, err := call(context.Background(), cc, echoPath, v)
				assert.NoError(t, err)
				assert.Equal(t, v, out)
			}
		})
	}
	wg.Wait()
}

// TestShutdownEndsServe: Serve returns ErrServerClosed once Shutdown has
// ended the server, without the caller closing the listener too (as
// net/http's Serve does). Why it matters: servegrpc.go closes the listener
// first, so Serve returns the listener's error before Shutdown begins, and
// `sluice serve -grpc` logs "grpc serve failed" at every stop.
func TestShutdownEndsServe(t *testing.T) {
	f := start(t, h2grpc.Config{}, fixtureOpt{})
	require.NoError(t, f.srv.Shutdown(context.Background()))
	select {
	case err := <-f.served:
		assert.ErrorIs(t, err, h2grpc.ErrServerClosed)
		f.served <- err
	case <-time.After(5 * time.Second):
		t.Error("Serve still accepts after Shutdown")
	}
}

// goroutinesIn counts the goroutines whose stack holds fn.
func goroutinesIn(fn string) int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), fn)
}

// TestCloseEndsHandshakes: Close (and Shutdown) end connections still in
// their TLS handshake at once, as they do connections before their first
// call, rather than leaving them to RecvTimeout.
func TestCloseEndsHandshakes(t *testing.T) {
	f := start(t, h2grpc.Config{RecvTimeout: time.Minute}, fixtureOpt{tls: true})
	c, err := net.Dial("tcp", f.addr) // and no ClientHello
	require.NoError(t, err)
	defer c.Close()
	const fn = "h2grpc.(*Server).serve("
	require.Eventually(t, func() bool { return goroutinesIn(fn) == 1 }, 10*time.Second, time.Millisecond)
	// Close waits for the connections' goroutines, so a handshake left
	// waiting holds it up to RecvTimeout (a minute here). Why not count
	// goroutines right after Close: the one that ran serve may still be
	// returning from it when Close's wait ends.
	closed := make(chan struct{})
	go func() { f.srv.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close still waits on a connection in its TLS handshake")
	}
	assert.Eventually(t, func() bool { return goroutinesIn(fn) == 0 }, 10*time.Second, time.Millisecond)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = c.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF, "the server closed the connection")
}
