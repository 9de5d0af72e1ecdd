package h2grpc_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	_ "google.golang.org/grpc/encoding/gzip" // registers gzip for the client
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-go/sluice/cmd/sluice/internal/h2grpc"
)

// fastRaw is a raw client on a connection h2grpc keeps: its first call
// (stream 1, Echo) is answered.
func fastRaw(t *testing.T, f *fixture, settings ...http2.Setting) *raw {
	t.Helper()
	r := dialRaw(t, f.addr, settings...)
	r.unaryCall(1, echoPath, "first")
	require.Equal(t, 0, r.ended(1).status())
	return r
}

// --- flow control ---

// TestZeroInitialWindow: a client with SETTINGS_INITIAL_WINDOW_SIZE 0 gets
// an answer's headers and no DATA until it opens the stream's window.
func TestZeroInitialWindow(t *testing.T) {
	f := start(t, h2grpc.Config{}, fixtureOpt{})
	r := dialRaw(t, f.addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
	r.unaryCall(1, echoPath, "hello")
	r.until(func() bool { s := r.streams[1]; return s != nil && s.headers != nil })
	r.sync() // had the server ignored the window, DATA would have come with the headers
	s := r.streams[1]
	assert.Empty(t, s.dataFrames)
	assert.False(t, s.ended)
	assert.Equal(t, "application/grpc", s.headers["content-type"])

	require.NoError(t, r.fr.WriteWindowUpdate(1, 3))
	r.until(func() bool { return len(s.data) >= 3 })
	r.sync()
	assert.Equal(t, []int{3}, s.dataFrames, "no more than the window")
	require.NoError(t, r.fr.WriteWindowUpdate(1, 1000))
	r.ended(1)
	assert.Equal(t, msg("hello"), s.data)
	assert.Equal(t, 0, s.status())
}

// TestDataFrameSizes: an answer bigger than a frame is sent in DATA frames
// no bigger than the client's SETTINGS_MAX_FRAME_SIZE.
func TestDataFrameSizes(t *testing.T) {
	f := start(t, h2grpc.Config{}, fixtureOpt{})
	for _, limit := range []uint32{16384, 20000} {
		r := dialRaw(t, f.addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30},
			http2.Setting{ID: http2.SettingMaxFrameSize, Val: limit})
		require.NoError(t, r.fr.WriteWindowUpdate(0, 1<<30))
		r.unaryCall(1, bigPath, "100000")
		s := r.ended(1)
		require.Equal(t, 0, s.status())
		assert.Equal(t, msg(strings.Repeat("x", 100000)), s.data)
		biggest := 0
		for _, n := range s.dataFrames {
			assert.LessOrEqual(t, n, int(limit))
			biggest = max(biggest, n)
		}
		assert.Equal(t, int(limit), biggest, "frames are filled up to the client's maximum")
	}
}

// TestConnWindowUpdateFlushed: the connection's WINDOW_UPDATE reaches the
// client without waiting for an answer. Here every request's handler
// blocks, so no answer is written; a client that waits for connection
// window before sending a third request must get it.
func TestConnWindowUpdateFlushed(t *testing.T) {
	f := start(t, h2grpc.Config{ConnWindow: 65535, StreamWindow: 65535, MaxRequestBytes: 1 << 20}, fixtureOpt{})
	r := dialRaw(t, f.addr)
	body := msg(strings.Repeat("b", 16000)) // one DATA frame each
	r.open(1, blockPath, false)
	r.send(1, body, true)
	r.open(3, blockPath, false)
	r.send(3, body, true) // 32 KB of the 64 KB connection window: past its quarter
	got := false
	for !got {
		require.True(t, r.readWithin(3*time.Second))
		got = len(r.frames) > 0 && r.frames[len(r.frames)-1].typ == http2.FrameWindowUpdate &&
			r.frames[len(r.frames)-1].stream == 0
	}
}

// TestWindowGivenBackOnReceipt: the server gives receive window back as
// DATA arrives (a stream's at half its window, the connection's at a
// quarter), not as handlers take it, so a client sending far past the first
// windows without waiting, in frames of at most 16384 bytes, never overruns
// them: no FLOW_CONTROL_ERROR can be provoked that way. (A bigger frame can:
// see TestOversizedFrame.) Requests stay bounded by MaxRequestBytes and
// MaxStreams.
func TestWindowGivenBackOnReceipt(t *testing.T) {
	f := start(t, h2grpc.Config{ConnWindow: 65535, StreamWindow: 65535, MaxRequestBytes: 1 << 20}, fixtureOpt{})
	r := fastRaw(t, f, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 30})
	require.NoError(t, r.fr.WriteWindowUpdate(0, 1<<30))
	v := strings.Repeat("w", 300000) // 4.6 times both windows, sent without reading
	r.open(3, echoPath, false)
	r.send(3, msg(v), true)
	s := r.ended(3)
	assert.Nil(t, s.rst)
	assert.Equal(t, 0, s.status())
	assert.Equal(t, msg(v), s.data)
	assert.Nil(t, r.goAway)
}

// --- protocol errors: GOAWAY, then close ---

func TestProtocolErrors(t *testing.T) {
	f := start(t, h2grpc.Config{}, fixtureOpt{})
	for _, tc := range []struct {
		name string
		do   func(r *raw)
		want goAway
	}{
		{"even stream id", func(r *raw) { r.open(2, echoPath, false) }, goAway{http2.ErrCodeProtocol, 1, "even stream id"}},
		{"data on an idle stream", func(r *raw) { require.NoError(t, r.fr.WriteData(5, true, msg("x"))) },
			goAway{http2.ErrCodeProtocol, 1, "data on an idle stream"}},
		{"headers on a closed stream", func(r *raw) { r.open(1, echoPath, false) }, goAway{http2.ErrCodeStreamClosed, 1, "headers on a closed stream"}},
		{"push promise", func(r *raw) {
			require.NoError(t, r.fr.WritePushPromise(http2.PushPromiseParam{StreamID: 1, PromiseID: 2, BlockFragment: r.block(echoPath), EndHeaders: true}))
		}, goAway{http2.ErrCodeProtocol, 1, "push from a client"}},
		{"data on stream 0", func(r *raw) { require.NoError(t, r.fr.WriteRawFrame(http2.FrameData, 0, 0, []byte("x"))) },
			goAway{http2.ErrCodeProtocol, 1, ""}},
		{"window overflow", func(r *raw) {
			require.NoError(t, r.fr.WriteWindowUpdate(0, 1<<31-1))
		}, goAway{http2.ErrCodeFlowControl, 1, "window overflow"}},
		{"bad setting", func(r *raw) {
			require.NoError(t, r.fr.WriteRawFrame(http2.FrameSettings, 0, 0, []byte{0, 4, 0x80, 0, 0, 0})) // INITIAL_WINDOW_SIZE 2^31
		}, goAway{http2.ErrCodeFlowControl, 1, ""}},
		{"continuation without headers", func(r *raw) { require.NoError(t, r.fr.WriteContinuation(3, true, r.block(echoPath))) },
			goAway{http2.ErrCodeProtocol, 1, ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := fastRaw(t, f)
			tc.do(r)
			g := r.closed()
			require.NotNil(t, g, "a GOAWAY before the close")
			assert.Equal(t, tc.want, *g)
		})
	}
}

// TestOversizedFrame: a frame past the server's SETTINGS_MAX_FRAME_SIZE
// (16384, the default) is a FRAME_SIZE_ERROR of the connection (RFC 9113
// 4.2): GOAWAY, then close.
func TestOversizedFrame(t *testing.T) {
	f := start(t, h2grpc.Config{MaxRequestBytes: 1 << 20}, fixtureOpt{})
	r := fastRaw(t, f)
	r.open(3, echoPath, false)
	require.NoError(t, r.fr.WriteData(3, false, make([]byte, 20000)))
	g := r.closed()
	require.NotNil(t, g, "a GOAWAY before the close")
	assert.Equal(t, http2.ErrCodeFrameSize, g.code)
}

// TestStreamErrorKeepsConnection: a malformed header block (an upper-case
// field name, RFC 9113 8.2.1) is an error of its stream: RST_STREAM
// PROTOCOL_ERROR, and the connection goes on serving (as conn.readFailed's
// comment says it does).
func TestStreamErrorKeepsConnection(t *testing.T) {
	f := start(t, h2grpc.Config{}, fixtureOpt{})
	r := fastRaw(t, f)
	r.open(3, echoPath, false, hpack.HeaderField{Name: "X-Upper", Value: "1"})
	s := r.ended(3)
	require.NotNil(t, s.rst)
	assert.Equal(t, http2.ErrCodeProtocol, *s.rst)
	r.unaryCall(5, echoPath, "still here")
	assert.Equal(t, 0, r.ended(5).status())
}

// TestTruncatedHeaderList: a header list past MaxRequestBytes (which the
// framer truncates, dropping the fields past the limit) is not served as
// if it were whole: grpc-go resets such a stream (FRAME_SIZE_ERROR).
func TestTruncatedHeaderList(t *testing.T) {
	f := start(t, h2grpc.Config{MaxRequestBytes: 1000}, fixtureOpt{})
	r := fastRaw(t, f)
	calls := f.svc.echoCalls.Load()
	pad := strings.Repeat("p", 400)
	r.open(3, echoPath, false, hpack.HeaderField{Name: "x-a", Value: pad}, hpack.HeaderField{Name: "x-b", Value: pad},
		hpack.HeaderField{Name: "x-c", Value: pad}, hpack.HeaderField{Name: "grpc-encoding", Value: "gzip"})
	r.send(3, msg("truncated"), true)
	s := r.ended(3)
	assert.Equal(t, calls, f.svc.echoCalls.Load(), "the handler ran for a call whose headers were cut")
	assert.True(t, s.rst != nil || s.status() > 0, "answered %v", s.trailers)
}

// floodContinuation sends a header block on stream id of many CONTINUATION
// frames, each full of literal fields, until the server closes the
// connection or max bytes are sent; it returns what it sent and its write
// error.
func floodContinuation(r *raw, id uint32, max int) (int, error) {
	r.t.Helper()
	if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.block(echoPath)}); err != nil {
		return 0, err
	}
	r.hbuf.Reset()
	for r.hbuf.Len() < 15000 {
		_ = r.enc.WriteField(hpack.HeaderField{Name: "x-flood", Value: strings.Repeat("f", 500), Sensitive: true})
	}
	frag := r.hbuf.Bytes()
	sent := 0
	for sent < max {
		if err := r.fr.WriteContinuation(id, false, frag); err != nil {
			return sent, err
		}
		sent += len(frag) + 9
	}
	return sent, nil
}

// TestContinuationFlood: a header block past MaxRequestBytes in endless
// CONTINUATION frames ends its connection (GOAWAY PROTOCOL_ERROR) long
// before the client is done sending it: the server does not read it all.
func TestContinuationFlood(t *testing.T) {
	f := start(t, h2grpc.Config{MaxRequestBytes: 4096}, fixtureOpt{})
	t.Run("fast connection", func(t *testing.T) {
		r := fastRaw(t, f)
		type result struct {
			sent int
			err  error
		}
		done := make(chan result, 1)
		go func() { n, err := floodContinuation(r, 3, 256<<20); done <- result{n, err} }()
		g := r.closed()
		res := <-done
		require.Error(t, res.err, "the flood was sent whole (%d bytes)", res.sent)
		require.NotNil(t, g)
		assert.Equal(t, goAway{http2.ErrCodeProtocol, 1, ""}, *g)
	})
	t.Run("first call", func(t *testing.T) {
		// Before the first call is known, the sniff stops at 64 KiB and
		// (without Handoff) closes the connection.
		r := dialRaw(t, f.addr)
		n, err := floodContinuation(r, 1, 256<<20)
		require.Error(t, err, "the flood was sent whole (%d bytes)", n)
		assert.Nil(t, r.closed())
	})
}

// --- limits ---

// TestMaxStreams: past MaxStreams open streams, a new one is refused
// (REFUSED_STREAM); once one ends, a new one is served.
func TestMaxStreams(t *testing.T) {
	f := start(t, h2grpc.Config{MaxStreams: 3}, fixtureOpt{})
	r := dialRaw(t, f.addr)
	r.settled()
	assert.Equal(t, uint32(3), r.settings[http2.SettingMaxConcurrentStreams])
	for id := uint32(1); id <= 5; id += 2 {
		r.unaryCall(id, blockPath, "held")
	}
	for range 3 {
		<-f.svc.started
	}
	r.unaryCall(7, echoPath, "refused")
	assert.Equal(t, http2.ErrCodeRefusedStream, *r.ended(7).rst)
	f.svc.releaseAll()
	for id := uint32(1); id <= 5; id += 2 {
		assert.Equal(t, 0, r.ended(id).status())
	}
	r.unaryCall(9, echoPath, "served")
	assert.Equal(t, 0, r.ended(9).status())
}

// TestRapidReset: streams reset by the client as soon as they are sent
// still count until their handlers return, so the handlers running never
// exceed MaxStreams, and the streams past it are refused while they run.
func TestRapidReset(t *testing.T) {
	f := start(t, h2grpc.Config{MaxStreams: 4}, fixtureOpt{})
	r := dialRaw(t, f.addr)
	var ids []uint32
	for id := uint32(1); id < 200; id += 2 {
		r.unaryCall(id, blockPath, "stuck")
		require.NoError(t, r.fr.WriteRSTStream(id, http2.ErrCodeCancel))
		ids = append(ids, id)
	}
	for range 4 {
		<-f.svc.started
	}
	r.sync()
	for _, id := range ids[4:] {
		s := r.ended(id)
		require.NotNil(t, s.rst, "stream %d", id)
		assert.Equal(t, http2.ErrCodeRefusedStream, *s.rst, "stream %d", id)
	}
	for _, id := range ids[:4] {
		assert.NotContains(t, r.streams, id, "a reset stream is not answered")
	}
	assert.Equal(t, int32(4), f.svc.running.Load())
	assert.Equal(t, int32(4), f.svc.maxRun.Load())
	select {
	case v := <-f.svc.started:
		t.Fatalf("a fifth handler started (%q)", v)
	default:
	}

	f.svc.releaseAll()
	require.Eventually(t, func() bool { return f.svc.running.Load() == 0 }, 10*time.Second, time.Millisecond)
	r.unaryCall(201, echoPath, "after")
	assert.Equal(t, 0, r.ended(201).status())
}

// TestRequestTooLarge: a request whose length prefix is past
// MaxRequestBytes is answered RESOURCE_EXHAUSTED at once, the client told
// to stop sending (RST_STREAM NO_ERROR).
func TestRequestTooLarge(t *testing.T) {
	f := start(t, h2grpc.Config{MaxRequestBytes: 1000}, fixtureOpt{})
	r := fastRaw(t, f)
	r.open(3, echoPath, false)
	prefix := make([]byte, 5, 105)
	binary.BigEndian.PutUint32(prefix[1:], 5000)
	r.send(3, append(prefix, make([]byte, 100)...), false) // and never the rest
	s := r.ended(3)
	assert.Equal(t, 8, s.status())
	assert.Equal(t, "grpc: received message larger than max (5000 vs. 1000)", s.trailers["grpc-message"])
	r.until(func() bool { return s.rst != nil })
	assert.Equal(t, http2.ErrCodeNo, *s.rst)

	cc := f.client()
	_, err := call(context.Background(), cc, echoPath, strings.Repeat("z", 2000))
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
}

// TestCompressedFlag: a message with its compressed flag set, without a
// grpc-encoding, is answered INTERNAL.
func TestCompressedFlag(t *testing.T) {
	f := start(t, h2grpc.Config{}, fixtureOpt{})
	r := fastRaw(t, f)
	r.open(3, echoPath, false)
	body := msg("squeezed")
	body[0] = 1
	r.send(3, body, true)
	s := r.ended(3)
	assert.Equal(t, 13, s.status())
	assert.Equal(t, "grpc: compressed flag set with identity or empty encoding", s.trailers["grpc-message"])
}

// TestGzipEncoding: a call with grpc-encoding gzip is answered
// UNIMPLEMENTED (no decompressor), by a raw client and grpc-go's.
func TestGzipEncoding(t *testing.T) {
	f := start(t, h2grpc.Config{}, fixtureOpt{})
	r := fastRaw(t, f)
	r.open(3, echoPath, false, hpack.HeaderField{Name: "grpc-encoding", Value: "gzip"})
	s := r.ended(3)
	assert.Equal(t, 12, s.status())
	assert.Equal(t, `grpc: Decompressor is not installed for grpc-encoding "gzip"`, s.trailers["grpc-message"])

	cc := f.client()
	_, err := call(context.Background(), cc, echoPath, "x")
	require.NoError(t, err)
	_, err = call(context.Background(), cc, echoPath, "x", grpc.UseCompressor("gzip"))
	assert.Equal(t, codes.Unimplemented, status.Code(err))
}

// TestPingPolicy: pings with answers in between are welcome; a fourth
// ping within 5 s with no answer since the first gets GOAWAY
// ENHANCE_YOUR_CALM, as grpc-go's enforcement does.
func TestPingPolicy(t *testing.T) {
	f := start(t, h2grpc.Config{}, fixtureOpt{})
	t.Run("with answers", func(t *testing.T) {
		r := fastRaw(t, f)
		for i := range 10 {
			r.sync()
			id := uint32(3 + 2*i)
			r.unaryCall(id, echoPath, "between pings")
			require.Equal(t, 0, r.ended(id).status())
		}
		r.sync()
		assert.Nil(t, r.goAway)
	})
	t.Run("flood", func(t *testing.T) {
		r := fastRaw(t, f)
		for range 3 {
			r.sync()
		}
		require.NoError(t, r.fr.WritePing(false, syncData))
		g := r.closed()
		assert.Equal(t, 3, r.pingAcks)
		require.NotNil(t, g)
		assert.Equal(t, goAway{http2.ErrCodeEnhanceYourCalm, 1, "too_many_pings"}, *g)
	})
}

// TestHalfOpenStream: a stream with headers and no message is answered
// DEADLINE_EXCEEDED at RecvTimeout (give or take the janitor's tick,
// RecvTimeout/4).
func TestHalfOpenStream(t *testing.T) {
	const recv = 400 * time.Millisecond
	f := start(t, h2grpc.Config{RecvTimeout: recv}, fixtureOpt{})
	r := fastRaw(t, f)
	began := time.Now()
	r.open(3, echoPath, false)
	s := r.ended(3)
	took := time.Since(began)
	assert.Equal(t, 4, s.status())
	assert.Equal(t, "sluice: the request did not arrive in time", s.trailers["grpc-message"])
	assert.GreaterOrEqual(t, took, recv)
	assert.Less(t, took, recv+recv/4+time.Second)
	r.until(func() bool { return s.rst != nil })
	assert.Equal(t, http2.ErrCodeNo, *s.rst)
}

// TestIdleTimeout: a connection without streams for IdleTimeout gets
// GOAWAY "max_idle", then is closed; one that never sends a call is closed
// at IdleTimeout too.
func TestIdleTimeout(t *testing.T) {
	const idle = 300 * time.Millisecond
	f := start(t, h2grpc.Config{IdleTimeout: idle}, fixtureOpt{})
	r := fastRaw(t, f)
	began := time.Now()
	g := r.closed()
	took := time.Since(began)
	require.NotNil(t, g)
	assert.Equal(t, goAway{http2.ErrCodeNo, 1, "max_idle"}, *g)
	assert.GreaterOrEqual(t, took, idle-idle/4)
	assert.Less(t, took, idle+time.Second)

	r2 := dialRaw(t, f.addr)
	began = time.Now()
	assert.Nil(t, r2.closed())
	took = time.Since(began)
	assert.GreaterOrEqual(t, took, idle-idle/4)
	assert.Less(t, took, idle+time.Second)
}

// TestAdmitRelease: Admit refusing a stream answers it RESOURCE_EXHAUSTED;
// Release is called exactly once per admitted stream, however it ends:
// answered, reset by the client while its request arrives or while its
// handler runs, or with its connection closed mid-call.
func TestAdmitRelease(t *testing.T) {
	var admitted, released atomic.Int64
	var refuse atomic.Bool
	f := start(t, h2grpc.Config{
		Admit: func() bool {
			if refuse.Load() {
				return false
			}
			admitted.Add(1)
			return true
		},
		Release: func() { released.Add(1) },
	}, fixtureOpt{})
	r := fastRaw(t, f) // stream 1: admitted, answered
	assert.Equal(t, int64(1), admitted.Load())
	// Release comes after the answer is written: wait for it.
	require.Eventually(t, func() bool { return released.Load() == 1 }, 10*time.Second, time.Millisecond)

	refuse.Store(true)
	r.unaryCall(3, echoPath, "refused")
	s := r.ended(3)
	assert.Equal(t, 8, s.status())
	assert.Equal(t, "sluice: too many requests in flight, try again", s.trailers["grpc-message"])
	refuse.Store(false)

	r.open(5, echoPath, false) // reset while its request arrives
	require.NoError(t, r.fr.WriteRSTStream(5, http2.ErrCodeCancel))
	r.unaryCall(7, blockPath, "stuck") // reset while its handler runs
	<-f.svc.started
	require.NoError(t, r.fr.WriteRSTStream(7, http2.ErrCodeCancel))
	r.sync()
	assert.Equal(t, int64(3), admitted.Load())
	assert.Equal(t, int64(2), released.Load(), "stream 7's handler still runs")

	r2 := fastRaw(t, f)
	r2.open(3, echoPath, false)
	r2.unaryCall(5, blockPath, "stuck")
	<-f.svc.started
	r2.sync()
	require.NoError(t, r2.c.Close()) // mid-call
	require.Eventually(t, func() bool { return released.Load() == 4 }, 10*time.Second, time.Millisecond,
		"stream 1 and the one receiving on the closed connection: released %d", released.Load())
	assert.Equal(t, int64(6), admitted.Load())

	f.svc.releaseAll()
	require.Eventually(t, func() bool { return released.Load() == 6 }, 10*time.Second, time.Millisecond)
	r.unaryCall(9, echoPath, "after")
	require.Equal(t, 0, r.ended(9).status())
	// Release comes after the answer is written: wait for it.
	require.Eventually(t, func() bool { return released.Load() == 7 }, 10*time.Second, time.Millisecond)
	assert.Equal(t, int64(7), admitted.Load())
	require.NoError(t, f.srv.Shutdown(context.Background()))
	assert.Equal(t, int64(7), released.Load(), "no Release twice")
}

// --- a client that does not read ---

// gateConn is a server's connection whose writes can be held (as a client
// that stops reading would, once the socket buffers fill); a held write
// ends at the write deadline or when the connection is closed.
type gateConn struct {
	net.Conn
	mu     sync.Mutex
	gate   chan struct{} // non-nil: writes wait for it to be closed
	wdl    time.Time
	closed chan struct{}
	once   sync.Once
}

func newGateConn(c net.Conn) *gateConn { return &gateConn{Conn: c, closed: make(chan struct{})} }

func (g *gateConn) hold() {
	g.mu.Lock()
	g.gate = make(chan struct{})
	g.mu.Unlock()
}

func (g *gateConn) free() {
	g.mu.Lock()
	if g.gate != nil {
		close(g.gate)
		g.gate = nil
	}
	g.mu.Unlock()
}

func (g *gateConn) SetDeadline(t time.Time) error {
	g.mu.Lock()
	g.wdl = t
	g.mu.Unlock()
	return g.Conn.SetDeadline(t)
}

func (g *gateConn) SetWriteDeadline(t time.Time) error {
	g.mu.Lock()
	g.wdl = t
	g.mu.Unlock()
	return g.Conn.SetWriteDeadline(t)
}

func (g *gateConn) Write(p []byte) (int, error) {
	g.mu.Lock()
	gate, dl := g.gate, g.wdl
	g.mu.Unlock()
	if gate != nil {
		var timeout <-chan time.Time
		if !dl.IsZero() {
			tm := time.NewTimer(time.Until(dl))
			defer tm.Stop()
			timeout = tm.C
		}
		select {
		case <-gate:
		case <-g.closed:
			return 0, net.ErrClosed
		case <-timeout:
			return 0, os.ErrDeadlineExceeded
		}
	}
	return g.Conn.Write(p)
}

func (g *gateConn) Close() error {
	g.once.Do(func() { close(g.closed) })
	return g.Conn.Close()
}

// startGated is start with each accepted connection a gateConn, sent on
// the returned channel.
func startGated(t *testing.T, cfg h2grpc.Config) (*fixture, chan *gateConn) {
	gates := make(chan *gateConn, 4)
	f := start(t, cfg, fixtureOpt{wrap: func(c net.Conn) net.Conn { g := newGateConn(c); gates <- g; return g }})
	return f, gates
}

// TestStuckWriteClosed: a connection whose writes are stuck (a client that
// does not read) is closed about RecvTimeout later, whoever was writing: a
// worker flushing a small answer, a worker in the middle of a large one
// (bufio flushing by itself), or the janitor answering a late stream.
func TestStuckWriteClosed(t *testing.T) {
	const recv = 300 * time.Millisecond
	for _, tc := range []struct {
		name string
		do   func(r *raw)
	}{
		{"small answer", func(r *raw) { r.unaryCall(3, echoPath, "unread") }},
		{"large answer", func(r *raw) { r.unaryCall(3, bigPath, "60000") }},
		{"janitor", func(r *raw) { r.open(3, echoPath, false) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, gates := startGated(t, h2grpc.Config{RecvTimeout: recv})
			r := fastRaw(t, f, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20})
			g := <-gates
			t.Cleanup(g.free) // before the fixture's cleanup: nothing stays stuck
			g.hold()
			tc.do(r)
			select {
			case <-g.closed:
			case <-time.After(10*recv + 2*time.Second):
				t.Fatal("a connection stuck in a write was not closed")
			}
		})
	}
}

// TestShutdownHonoursCtx: Shutdown returns with ctx's error when ctx ends,
// even if a connection is stuck in a write (its lock held), and Close then
// ends it.
func TestShutdownHonoursCtx(t *testing.T) {
	f, gates := startGated(t, h2grpc.Config{RecvTimeout: time.Minute})
	r := fastRaw(t, f)
	g := <-gates
	t.Cleanup(g.free)
	g.hold()
	r.unaryCall(3, echoPath, "unread")
	require.Eventually(t, func() bool { return f.svc.echoCalls.Load() == 2 }, 10*time.Second, time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- f.srv.Shutdown(ctx) }()
	select {
	case err := <-shut:
		assert.True(t, errors.Is(err, context.DeadlineExceeded), "Shutdown: %v", err)
	case <-time.After(5 * time.Second):
		g.free()
		<-shut
		t.Fatal("Shutdown ignored its ctx while a connection was stuck in a write")
	}
	f.srv.Close()
	select {
	case <-g.closed:
	default:
		t.Error("Close left the stuck connection open")
	}
}

// --- a connection ended by a failed write ---

// brokenConn is a server's connection whose writes fail once it is broken
// (as they do when the client has gone: EPIPE), and whose next read after
// expect(n) returns n bytes at least, so that frames the client sent in one
// write are read together, as they usually are.
type brokenConn struct {
	net.Conn
	broken atomic.Bool
	want   atomic.Int64
}

func (c *brokenConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if want := int(c.want.Swap(0)); err == nil && n < want && want <= len(p) {
		var m int
		m, err = io.ReadAtLeast(c.Conn, p[n:], want-n)
		n += m
	}
	return n, err
}

func (c *brokenConn) Write(p []byte) (int, error) {
	if c.broken.Load() {
		return 0, syscall.EPIPE
	}
	return c.Conn.Write(p)
}

// TestNoStreamsAfterFailedWrite: once a write has failed and the
// connection is closed, the frames read with the one whose answer failed
// open no streams: no place is taken in the server-wide budget (Admit)
// that no Release gives back, and no handler runs for a client that is
// gone.
func TestNoStreamsAfterFailedWrite(t *testing.T) {
	var admitted, released atomic.Int64
	conns := make(chan *brokenConn, 1)
	f := start(t, h2grpc.Config{
		Admit:   func() bool { admitted.Add(1); return true },
		Release: func() { released.Add(1) },
	}, fixtureOpt{wrap: func(c net.Conn) net.Conn { b := &brokenConn{Conn: c}; conns <- b; return b }})
	r := fastRaw(t, f)
	bc := <-conns
	r.sync() // no ack held back: the next write is the SETTINGS ack below
	require.Eventually(t, func() bool { return released.Load() == 1 }, 10*time.Second, time.Millisecond)
	calls := f.svc.echoCalls.Load()

	// One write: SETTINGS (whose ack fails), a call's headers, a whole call.
	var out bytes.Buffer
	fr := http2.NewFramer(&out, nil)
	require.NoError(t, fr.WriteSettings())
	require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: r.block(echoPath), EndHeaders: true}))
	require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 5, BlockFragment: r.block(echoPath), EndHeaders: true}))
	require.NoError(t, fr.WriteData(5, true, msg("gone")))
	bc.want.Store(int64(out.Len()))
	bc.broken.Store(true)
	_, err := r.c.Write(out.Bytes())
	require.NoError(t, err)
	r.closed()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, f.srv.Shutdown(ctx)) // the connection's reader has returned
	f.srv.Close()                           // and the workers have stopped waiting
	assert.Equal(t, calls, f.svc.echoCalls.Load(), "a handler ran for a connection already closed")
	assert.Equal(t, admitted.Load(), released.Load(), "admitted %d, released %d", admitted.Load(), released.Load())
}

// TestResetWhileWaitingForWindow: an answer waiting for window ends when
// its client resets the stream: its place (Release) is given back at once,
// not at the janitor's next tick, and it writes nothing more on the stream,
// even once the window opens (the connection's, which other streams need).
func TestResetWhileWaitingForWindow(t *testing.T) {
	var admitted, released atomic.Int64
	f := start(t, h2grpc.Config{
		RecvTimeout: time.Minute, // the janitor's tick: 15 s
		Admit:       func() bool { admitted.Add(1); return true },
		Release:     func() { released.Add(1) },
	}, fixtureOpt{})

	t.Run("reset", func(t *testing.T) {
		r := dialRaw(t, f.addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0})
		r.unaryCall(1, echoPath, "first")
		require.NoError(t, r.fr.WriteWindowUpdate(1, 100))
		require.Equal(t, 0, r.ended(1).status())
		r.unaryCall(3, bigPath, "1000")
		r.until(func() bool { return r.stream(3).headers != nil }) // then it waits for window
		require.NoError(t, r.fr.WriteRSTStream(3, http2.ErrCodeCancel))
		require.Eventually(t, func() bool { return released.Load() == admitted.Load() }, 5*time.Second, time.Millisecond,
			"the reset stream's place is held (admitted %d, released %d)", admitted.Load(), released.Load())
	})

	t.Run("reset, then the window opens", func(t *testing.T) {
		r := fastRaw(t, f, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20})
		r.unaryCall(3, bigPath, "100000") // more than the connection's window, which the client does not open
		r.until(func() bool { return len(r.stream(1).data)+len(r.stream(3).data) == 65535 })
		seen := len(r.frames)
		// One write: the reset, then the window the answer waits for.
		var out bytes.Buffer
		fr := http2.NewFramer(&out, nil)
		require.NoError(t, fr.WriteRSTStream(3, http2.ErrCodeCancel))
		require.NoError(t, fr.WriteWindowUpdate(0, 1<<20))
		_, err := r.c.Write(out.Bytes())
		require.NoError(t, err)
		r.unaryCall(5, echoPath, "after")
		require.Equal(t, 0, r.ended(5).status())
		require.Eventually(t, func() bool { return released.Load() == admitted.Load() }, 5*time.Second, time.Millisecond)
		r.sync()
		for _, fi := range r.frames[seen:] {
			assert.NotEqual(t, uint32(3), fi.stream, "a %v frame on stream 3 after its reset", fi.typ)
		}
	})
}

// TestSplitFrames: a first call whose header block is padded, carries a
// priority and ends in CONTINUATION frames (its :path past the first
// fragment) is still found unary and kept by h2grpc; requests in many
// small padded DATA frames, a message split anywhere, are whole when
// answered.
func TestSplitFrames(t *testing.T) {
	f := start(t, h2grpc.Config{}, fixtureOpt{handoff: true})
	r := dialRaw(t, f.addr)
	require.NoError(t, r.fr.WritePriority(1, http2.PriorityParam{Weight: 10}))
	block := r.block(whoPath)
	require.NoError(t, r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:3], PadLength: 7,
		Priority: http2.PriorityParam{Weight: 3}}))
	require.NoError(t, r.fr.WriteContinuation(1, false, block[3:10]))
	require.NoError(t, r.fr.WriteContinuation(1, true, block[10:]))
	body := msg("")
	for i := range body {
		require.NoError(t, r.fr.WriteDataPadded(1, false, body[i:i+1], make([]byte, 3)))
	}
	require.NoError(t, r.fr.WriteData(1, true, nil))
	s := r.ended(1)
	require.Equal(t, 0, s.status(), "%v", s.trailers)
	var out wrapperspb.StringValue
	require.NoError(t, proto.Unmarshal(s.data[5:], &out))
	assert.Equal(t, "h2grpc/insecure", out.Value)

	v := strings.Repeat("v", 60000)
	r.open(3, echoPath, false)
	for b := msg(v); len(b) > 0; {
		n := min(len(b), 999)
		require.NoError(t, r.fr.WriteDataPadded(3, false, b[:n], make([]byte, 100)))
		b = b[n:]
	}
	require.NoError(t, r.fr.WriteData(3, true, nil))
	s = r.ended(3)
	require.Equal(t, 0, s.status(), "%v", s.trailers)
	assert.Equal(t, msg(v), s.data)
}
