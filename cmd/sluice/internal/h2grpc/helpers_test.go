package h2grpc_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-go/sluice/cmd/sluice/internal/h2grpc"
)

// The test service's methods, by full name.
const (
	svcName    = "sluice.test.Test"
	echoPath   = "/" + svcName + "/Echo"   // answers its request
	failPath   = "/" + svcName + "/Fail"   // FAILED_PRECONDITION with the request as message
	blockPath  = "/" + svcName + "/Block"  // waits for release (or its ctx unless the request is "stuck")
	bigPath    = "/" + svcName + "/Big"    // answers the request's number of 'x'
	whoPath    = "/" + svcName + "/Who"    // which transport and credentials served it
	streamPath = "/" + svcName + "/Stream" // bidi streaming echo
)

// testService records what its handlers saw.
type testService struct {
	release   chan struct{} // closed: Block returns
	once      sync.Once
	started   chan string // a Block's request, when it starts
	ctxErr    chan error  // a Block's ctx error when its ctx ended first
	deadline  chan time.Duration
	running   atomic.Int32
	maxRun    atomic.Int32
	echoCalls atomic.Int64
}

func newTestService() *testService {
	return &testService{release: make(chan struct{}), started: make(chan string, 4096),
		ctxErr: make(chan error, 4096), deadline: make(chan time.Duration, 16)}
}

func (s *testService) releaseAll() { s.once.Do(func() { close(s.release) }) }

func unary(name string, h func(s *testService, ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error)) grpc.MethodDesc {
	return grpc.MethodDesc{MethodName: name, Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
		in := new(wrapperspb.StringValue)
		if err := dec(in); err != nil {
			return nil, err
		}
		return h(srv.(*testService), ctx, in)
	}}
}

var testDesc = grpc.ServiceDesc{
	ServiceName: svcName,
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		unary("Echo", func(s *testService, ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
			s.echoCalls.Add(1)
			if dl, ok := ctx.Deadline(); ok {
				select {
				case s.deadline <- time.Until(dl):
				default:
				}
			}
			return in, nil
		}),
		unary("Fail", func(_ *testService, _ context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
			return nil, status.Error(codes.FailedPrecondition, in.Value)
		}),
		unary("Block", func(s *testService, ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
			n := s.running.Add(1)
			defer s.running.Add(-1)
			for {
				m := s.maxRun.Load()
				if n <= m || s.maxRun.CompareAndSwap(m, n) {
					break
				}
			}
			s.started <- in.Value
			done := ctx.Done()
			if in.Value == "stuck" {
				done = nil // ignores its ctx: only release ends it
			}
			select {
			case <-s.release:
				return in, nil
			case <-done:
				s.ctxErr <- ctx.Err()
				return nil, ctx.Err()
			}
		}),
		unary("Big", func(_ *testService, _ context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
			n, err := strconv.Atoi(in.Value)
			if err != nil {
				return nil, status.Error(codes.InvalidArgument, err.Error())
			}
			return wrapperspb.String(strings.Repeat("x", n)), nil
		}),
		unary("Who", func(_ *testService, ctx context.Context, _ *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
			return wrapperspb.String(who(ctx)), nil
		}),
	},
	Streams: []grpc.StreamDesc{{StreamName: "Stream", ServerStreams: true, ClientStreams: true,
		Handler: func(_ any, ss grpc.ServerStream) error {
			for {
				in := new(wrapperspb.StringValue)
				if err := ss.RecvMsg(in); errors.Is(err, io.EOF) {
					return nil
				} else if err != nil {
					return err
				}
				if in.Value == "who" {
					in.Value = who(ss.Context())
				}
				if err := ss.SendMsg(in); err != nil {
					return err
				}
			}
		}}},
}

// who names the transport that served ctx's call (grpc-go sets a
// ServerTransportStream, h2grpc does not) and the peer's credentials.
func who(ctx context.Context) string {
	transport := "h2grpc"
	if grpc.ServerTransportStreamFromContext(ctx) != nil {
		transport = "grpc-go"
	}
	auth := "none"
	if p, ok := peer.FromContext(ctx); ok && p.AuthInfo != nil {
		auth = p.AuthInfo.AuthType()
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			auth += ":" + tls.VersionName(ti.State.Version)
		}
	}
	return transport + "/" + auth
}

// fixture is an h2grpc server on loopback, with a grpc-go server taking its
// hand-overs when handoff is set.
type fixture struct {
	t      *testing.T
	addr   string
	srv    *h2grpc.Server
	svc    *testService
	tls    *tls.Config // the client's, when the server speaks TLS
	served chan error  // Serve's answer
	ln     net.Listener
}

type fixtureOpt struct {
	handoff bool
	tls     bool
	workers int
	wrap    func(net.Conn) net.Conn // wraps each accepted connection
}

func discardLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func start(t *testing.T, cfg h2grpc.Config, o fixtureOpt) *fixture {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &fixture{t: t, addr: ln.Addr().String(), svc: newTestService(), served: make(chan error, 1), ln: ln}
	if cfg.Log == nil {
		cfg.Log = discardLog()
	}
	var serverTLS *tls.Config
	if o.tls {
		serverTLS, f.tls = testTLS(t)
	}
	var (
		g   *grpc.Server
		lis *h2grpc.Listener
		gwg sync.WaitGroup
	)
	if o.handoff {
		lis = h2grpc.NewListener(ln.Addr())
		cfg.Handoff = lis.Put
		creds := insecure.NewCredentials()
		if o.tls {
			creds = h2grpc.Creds()
		}
		g = grpc.NewServer(grpc.Creds(creds))
		g.RegisterService(&testDesc, f.svc)
		gwg.Go(func() { _ = g.Serve(lis) })
	}
	f.srv = h2grpc.New(cfg, o.workers)
	f.srv.RegisterService(&testDesc, f.svc)
	var sln net.Listener = ln
	if o.wrap != nil {
		sln = wrapListener{ln, o.wrap}
	}
	go func() { f.served <- f.srv.Serve(sln, serverTLS) }()
	t.Cleanup(func() {
		f.svc.releaseAll()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := f.srv.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
			f.srv.Close()
		}
		// Why after Shutdown: Serve answers ErrServerClosed only once
		// Shutdown has begun (see TestShutdownEndsServe).
		ln.Close()
		select {
		case err := <-f.served:
			require.ErrorIs(t, err, h2grpc.ErrServerClosed)
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return after Shutdown and the listener's close")
		}
		if g != nil {
			g.Stop()
			gwg.Wait()
		}
	})
	return f
}

type wrapListener struct {
	net.Listener
	wrap func(net.Conn) net.Conn
}

func (l wrapListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.wrap(c), nil
}

// client is a grpc-go client of f, closed when the test ends.
func (f *fixture) client(opts ...grpc.DialOption) *grpc.ClientConn {
	f.t.Helper()
	creds := insecure.NewCredentials()
	if f.tls != nil {
		creds = credentials.NewTLS(f.tls)
	}
	cc, err := grpc.NewClient(f.addr, append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, opts...)...)
	require.NoError(f.t, err)
	f.t.Cleanup(func() { cc.Close() })
	return cc
}

func call(ctx context.Context, cc *grpc.ClientConn, path, in string, opts ...grpc.CallOption) (string, error) {
	out := new(wrapperspb.StringValue)
	err := cc.Invoke(ctx, path, wrapperspb.String(in), out, opts...)
	return out.Value, err
}

// testTLS is a server config (a self-signed certificate for 127.0.0.1)
// and a client config trusting it, both offering h2.
func testTLS(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sluice test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	server = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, NextProtos: []string{"h2"}}
	client = &tls.Config{RootCAs: pool, NextProtos: []string{"h2"}}
	return server, client
}

// --- a raw HTTP/2 client ---

// raw speaks HTTP/2 frame by frame, to do what well-behaved clients do not,
// and records what the server sent.
type raw struct {
	t        *testing.T
	c        net.Conn
	fr       *http2.Framer
	enc      *hpack.Encoder
	hbuf     bytes.Buffer
	settings map[http2.SettingID]uint32 // the server's first SETTINGS
	streams  map[uint32]*rawStream
	goAway   *goAway
	eof      bool // the server closed the connection
	pingAcks int
	frames   []frameInfo
}

type goAway struct {
	code   http2.ErrCode
	lastID uint32
	debug  string
}

type frameInfo struct {
	typ    http2.FrameType
	stream uint32
	length uint32
}

// rawStream is what the server sent on a stream.
type rawStream struct {
	headers    map[string]string // the first header block
	trailers   map[string]string // the block with END_STREAM (the first, for a trailers-only answer)
	data       []byte
	dataFrames []int
	ended      bool // END_STREAM arrived
	rst        *http2.ErrCode
	window     int64 // WINDOW_UPDATE increments for this stream
}

// status is the stream's grpc-status, -1 if none.
func (s *rawStream) status() int {
	if s == nil || s.trailers == nil {
		return -1
	}
	n, err := strconv.Atoi(s.trailers["grpc-status"])
	if err != nil {
		return -1
	}
	return n
}

// dialRaw connects to addr and sends the preface and settings; it does not
// wait for the server's SETTINGS (read does).
func dialRaw(t *testing.T, addr string, settings ...http2.Setting) *raw {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	r := newRaw(t, c)
	_, err = io.WriteString(c, http2.ClientPreface)
	require.NoError(t, err)
	require.NoError(t, r.fr.WriteSettings(settings...))
	return r
}

func newRaw(t *testing.T, c net.Conn) *raw {
	r := &raw{t: t, c: c, fr: http2.NewFramer(c, c), settings: map[http2.SettingID]uint32{}, streams: map[uint32]*rawStream{}}
	r.enc = hpack.NewEncoder(&r.hbuf)
	r.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	r.fr.MaxHeaderListSize = 1 << 20
	r.fr.SetMaxReadFrameSize(1 << 24)
	return r
}

func (r *raw) stream(id uint32) *rawStream {
	s := r.streams[id]
	if s == nil {
		s = &rawStream{}
		r.streams[id] = s
	}
	return s
}

// block is an HPACK header block of a call to path, then extra.
func (r *raw) block(path string, extra ...hpack.HeaderField) []byte {
	r.hbuf.Reset()
	fields := append([]hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: path},
		{Name: ":authority", Value: "sluice"}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
	}, extra...)
	for _, f := range fields {
		require.NoError(r.t, r.enc.WriteField(f))
	}
	return bytes.Clone(r.hbuf.Bytes())
}

// open sends the HEADERS of a call to path on stream id.
func (r *raw) open(id uint32, path string, endStream bool, extra ...hpack.HeaderField) {
	r.t.Helper()
	require.NoError(r.t, r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.block(path, extra...),
		EndHeaders: true, EndStream: endStream}))
}

// msg is a gRPC message: its 5-byte prefix and a StringValue of v.
func msg(v string) []byte {
	b, err := proto.Marshal(&wrapperspb.StringValue{Value: v})
	if err != nil {
		panic(err)
	}
	return frameMsg(b)
}

func frameMsg(b []byte) []byte {
	out := make([]byte, 5, 5+len(b))
	binary.BigEndian.PutUint32(out[1:], uint32(len(b)))
	return append(out, b...)
}

// send sends body on stream id in DATA frames of at most 16384 bytes.
func (r *raw) send(id uint32, body []byte, endStream bool) {
	r.t.Helper()
	for {
		n := min(len(body), 16384)
		end := endStream && n == len(body)
		require.NoError(r.t, r.fr.WriteData(id, end, body[:n]))
		body = body[n:]
		if len(body) == 0 {
			return
		}
	}
}

// unaryCall sends a whole call of path with v on stream id.
func (r *raw) unaryCall(id uint32, path, v string) {
	r.t.Helper()
	r.open(id, path, false)
	r.send(id, msg(v), true)
}

var syncData = [8]byte{'s', 'y', 'n', 'c'}

// read reads one frame, failing the test if none comes within 10 s; it
// reports false once the connection is closed.
func (r *raw) read() bool {
	r.t.Helper()
	return r.readWithin(10 * time.Second)
}

func (r *raw) readWithin(d time.Duration) bool {
	r.t.Helper()
	if r.eof {
		return false
	}
	require.NoError(r.t, r.c.SetReadDeadline(time.Now().Add(d)))
	f, err := r.fr.ReadFrame()
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			r.t.Fatalf("no frame from the server within %v (streams %v)", d, r.describe())
		}
		r.eof = true
		return false
	}
	r.frames = append(r.frames, frameInfo{f.Header().Type, f.Header().StreamID, f.Header().Length})
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if !f.IsAck() && len(r.settings) == 0 {
			_ = f.ForeachSetting(func(s http2.Setting) error { r.settings[s.ID] = s.Val; return nil })
			r.settings[0] = 1 // received, even if empty
		}
		if !f.IsAck() {
			_ = r.fr.WriteSettingsAck()
		}
	case *http2.MetaHeadersFrame:
		s := r.stream(f.StreamID)
		fields := map[string]string{}
		for _, hf := range f.Fields {
			fields[hf.Name] = hf.Value
		}
		if s.headers == nil {
			s.headers = fields
		}
		if f.StreamEnded() {
			s.trailers, s.ended = fields, true
		}
	case *http2.DataFrame:
		s := r.stream(f.StreamID)
		s.data = append(s.data, f.Data()...)
		s.dataFrames = append(s.dataFrames, len(f.Data()))
		if f.StreamEnded() {
			s.ended = true
		}
	case *http2.RSTStreamFrame:
		code := f.ErrCode
		s := r.stream(f.StreamID)
		if s.rst == nil {
			s.rst = &code
		}
	case *http2.GoAwayFrame:
		r.goAway = &goAway{f.ErrCode, f.LastStreamID, string(f.DebugData())}
	case *http2.PingFrame:
		if f.IsAck() {
			r.pingAcks++
		}
	case *http2.WindowUpdateFrame:
		if f.StreamID != 0 {
			r.stream(f.StreamID).window += int64(f.Increment)
		}
	}
	return true
}

func (r *raw) describe() string {
	var b strings.Builder
	for id, s := range r.streams {
		b.WriteString(strconv.Itoa(int(id)) + ":")
		if s.rst != nil {
			b.WriteString("rst=" + s.rst.String())
		}
		if s.trailers != nil {
			b.WriteString("status=" + s.trailers["grpc-status"])
		}
		b.WriteString(" ")
	}
	if r.goAway != nil {
		b.WriteString("goaway=" + r.goAway.code.String())
	}
	return b.String()
}

// until reads frames until cond holds, failing if the connection ends
// first.
func (r *raw) until(cond func() bool) {
	r.t.Helper()
	for !cond() {
		if !r.read() {
			r.t.Fatalf("the connection ended (streams %v)", r.describe())
		}
	}
}

// settled reads up to the server's SETTINGS.
func (r *raw) settled() { r.t.Helper(); r.until(func() bool { return len(r.settings) > 0 }) }

// ended reads until the server has ended stream id (END_STREAM or
// RST_STREAM).
func (r *raw) ended(id uint32) *rawStream {
	r.t.Helper()
	r.until(func() bool { s := r.streams[id]; return s != nil && (s.ended || s.rst != nil) })
	return r.streams[id]
}

// sync returns once the server has handled every frame sent before (it
// answers a PING after them). Mind the ping policy: at most 3 pings in a
// row with no answer written in between.
func (r *raw) sync() {
	r.t.Helper()
	acks := r.pingAcks
	require.NoError(r.t, r.fr.WritePing(false, syncData))
	r.until(func() bool { return r.pingAcks > acks })
}

// closed reads until the server closes the connection, and returns the
// GOAWAY it sent (nil: none).
func (r *raw) closed() *goAway {
	r.t.Helper()
	for r.read() {
	}
	return r.goAway
}
