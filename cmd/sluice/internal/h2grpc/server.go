// Package h2grpc serves unary gRPC calls over HTTP/2 with one goroutine
// reading each connection and a kept worker answering each call, writing
// its answer itself: no writer goroutine, no per-frame hand-over. It is the
// transport of `sluice serve -grpc` for connections whose first call is a
// unary method it serves (Envoy's ShouldRateLimit); a connection that
// starts otherwise (a streaming call, an unknown method, a ping before any
// call) is handed over, its bytes replayed, to grpc-go (Config.Handoff).
//
// Why a transport of its own: a rate-limit call is a few hundred bytes
// each way, and Envoy keeps one call in flight on most of its connections;
// grpc-go spends most of such a call's CPU passing it between its reader,
// a handler goroutine and its writer (docs/benchmarks.md, "The transports
// alone"). Here a call costs one read and one write.
//
// What it does not do: streaming calls on a connection it serves (they are
// answered UNIMPLEMENTED, with a message saying to open a connection for
// them), compression (UNIMPLEMENTED), server push, priorities (ignored).
package h2grpc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
)

// Config bounds what clients can hold; see New for the defaults of zero
// fields.
type Config struct {
	// MaxStreams caps a connection's streams open at once, advertised in
	// SETTINGS_MAX_CONCURRENT_STREAMS; one past it is refused with
	// RST_STREAM REFUSED_STREAM. A stream counts until its answer is
	// written and its handler has returned, even if the client resets it
	// (so that resetting streams cannot start more handlers than this).
	MaxStreams uint32
	// RecvTimeout bounds a call from its headers to its answer, whatever
	// deadline the client asks for (a shorter one still holds). A call
	// whose request has not arrived by then is answered DEADLINE_EXCEEDED
	// (checked every RecvTimeout/4).
	RecvTimeout time.Duration
	// MaxRequestBytes caps a request message; a larger one is answered
	// RESOURCE_EXHAUSTED as soon as its length prefix arrives.
	MaxRequestBytes int
	// IdleTimeout closes a connection without streams for this long
	// (GOAWAY, then close).
	IdleTimeout time.Duration
	// StreamWindow and ConnWindow are the receive windows of a stream and
	// of a connection (HTTP/2 flow control).
	StreamWindow, ConnWindow uint32
	// Admit takes a place for a new stream in a server-wide budget, and
	// Release gives it back; a stream Admit refuses is answered
	// RESOURCE_EXHAUSTED. Nil: no budget.
	Admit   func() bool
	Release func()
	// Inline runs each call on its connection's reader, not on a worker:
	// for handlers that never wait (on I/O, on a lock held long, on other
	// calls), whose call is then one goroutine wake cheaper; the calls of
	// one connection then run one after another, and a client's RST_STREAM
	// is read after its call's handler has returned.
	Inline bool
	// InlineAlone runs a call on its connection's reader when it is the
	// connection's only open stream and nothing more has been read: a
	// client with one call in flight at a time then costs a goroutine
	// wake less per call, for handlers that may wait (on a store across
	// the network). A call that arrives on the connection while one runs
	// so waits for it to end, after which calls that find others run on
	// workers.
	InlineAlone bool
	// Handoff takes a connection this server does not serve, with the
	// bytes read from it so far replayed (the client's preface first) and
	// this server's SETTINGS already sent: a frame it answered nothing to.
	// Nil: such a connection is closed.
	Handoff func(net.Conn)
	// Log receives the errors of connections (at debug level) and of the
	// listener. Nil: slog.Default().
	Log *slog.Logger
}

// Server is a gRPC server of unary methods (see the package doc). Register
// services before Serve; after that it is safe for concurrent use.
type Server struct {
	cfg       Config
	methods   map[string]method // by full name, "/pkg.Service/Method"
	streaming map[string]bool
	services  map[string]bool // by name, "pkg.Service"
	work      chan work       // idle workers wait here
	maxIdle   int             // workers kept waiting for work
	settings  []byte          // the SETTINGS frame each connection is sent first
	idle      atomic.Int32    // workers waiting on work

	mu       sync.Mutex
	conns    map[net.Conn]*conn // nil: not decided yet
	lns      []net.Listener     // Serve's, closed by Shutdown and Close
	shutdown bool
	done     chan struct{} // closed when shutdown begins
	wg       sync.WaitGroup
}

type method struct {
	impl    any
	handler grpc.MethodHandler
}

// Defaults of Config's zero fields.
const (
	DefaultMaxStreams      = 100
	DefaultRecvTimeout     = 10 * time.Second
	DefaultMaxRequestBytes = 64 << 10
	DefaultIdleTimeout     = 2 * time.Minute
	DefaultStreamWindow    = 64 << 10
	DefaultConnWindow      = 1 << 20
)

// New returns a server with cfg, its zero fields at their defaults, keeping
// up to workers goroutines waiting for calls. Why kept workers: a call on a
// new goroutine grows (copies) its stack down the handler chain every time;
// a kept one has it grown already.
func New(cfg Config, workers int) *Server {
	if cfg.MaxStreams == 0 {
		cfg.MaxStreams = DefaultMaxStreams
	}
	if cfg.RecvTimeout <= 0 {
		cfg.RecvTimeout = DefaultRecvTimeout
	}
	if cfg.MaxRequestBytes <= 0 {
		cfg.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.StreamWindow < 65535 {
		cfg.StreamWindow = DefaultStreamWindow
	}
	if cfg.ConnWindow < 65535 {
		cfg.ConnWindow = DefaultConnWindow
	}
	if cfg.ConnWindow > 1<<31-1 {
		cfg.ConnWindow = 1<<31 - 1
	}
	if cfg.StreamWindow > 1<<31-1 {
		cfg.StreamWindow = 1<<31 - 1
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	s := &Server{cfg: cfg, methods: map[string]method{}, streaming: map[string]bool{},
		services: map[string]bool{},
		work:     make(chan work), maxIdle: workers, conns: map[net.Conn]*conn{}, done: make(chan struct{})}
	s.settings = s.settingsFrame()
	return s
}

// RegisterService serves sd's unary methods with impl; its streaming
// methods are left to the Handoff server (a connection that starts with one
// is handed over). It implements grpc.ServiceRegistrar.
func (s *Server) RegisterService(sd *grpc.ServiceDesc, impl any) {
	s.services[sd.ServiceName] = true
	for _, m := range sd.Methods {
		s.methods["/"+sd.ServiceName+"/"+m.MethodName] = method{impl: impl, handler: m.Handler}
	}
	for _, m := range sd.Streams {
		s.streaming["/"+sd.ServiceName+"/"+m.StreamName] = true
	}
}

// Inline reports Config.Inline.
func (s *Server) Inline() bool { return s.cfg.Inline }

// ErrServerClosed is Serve's answer once Shutdown or Close has begun.
var ErrServerClosed = errors.New("h2grpc: server closed")

// Serve accepts connections on ln and serves each on a goroutine of its
// own, over TLS when tlsConfig is not nil (its NextProtos should offer
// "h2"; the handshake must end within RecvTimeout). It returns when ln
// fails or is closed, ErrServerClosed after Shutdown or Close.
func (s *Server) Serve(ln net.Listener, tlsConfig *tls.Config) error {
	s.mu.Lock()
	if s.shutdown {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.lns = append(s.lns, ln)
	s.mu.Unlock()
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			select {
			case <-s.done:
				return ErrServerClosed
			default:
			}
			// As net/http: a temporary failure (out of descriptors) is
			// waited out, up to a second between tries.
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporary(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.cfg.Log.Error("grpc accept failed; retrying", "err", err, "in", backoff)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		go s.serve(nc, tlsConfig)
	}
}

func isTemporary(err error) bool {
	t, ok := err.(interface{ Temporary() bool })
	return ok && t.Temporary()
}

// ServeConn serves one connection (after its TLS handshake, if any: a
// *tls.Conn's verified chains reach the handlers as the peer's
// credentials.TLSInfo) and returns when it ends or is handed over.
func (s *Server) ServeConn(nc net.Conn) { s.serve(nc, nil) }

// serve serves nc, over TLS when tlsConfig is not nil. Shutdown and Close
// close nc (the connection accepted, under any TLS) from the start.
func (s *Server) serve(nc net.Conn, tlsConfig *tls.Config) {
	if !s.track(nc, nil) {
		nc.Close()
		return
	}
	defer s.wg.Done()
	defer s.untrack(nc)
	conn := nc
	if tlsConfig != nil {
		tc := tls.Server(nc, tlsConfig)
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.RecvTimeout)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			s.cfg.Log.Debug("grpc tls handshake failed", "remote", nc.RemoteAddr().String(), "err", err)
			nc.Close()
			return
		}
		conn = tc
	}
	rc, fast := s.sniff(conn)
	switch {
	case rc == nil:
		nc.Close()
	case !fast && s.cfg.Handoff == nil:
		nc.Close()
	case !fast:
		s.untrack(nc)
		s.cfg.Handoff(rc)
	default:
		c := newConn(s, conn, rc)
		if s.track(nc, c) {
			c.serve()
		} else {
			nc.Close()
		}
	}
}

// track records nc (c nil while its first call is not known yet); it
// reports false once the server is shutting down. A first record adds to
// s.wg, which ServeConn's return takes back.
func (s *Server) track(nc net.Conn, c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutdown {
		return false
	}
	if _, ok := s.conns[nc]; !ok {
		s.wg.Add(1)
	}
	s.conns[nc] = c
	return true
}

func (s *Server) untrack(nc net.Conn) {
	s.mu.Lock()
	delete(s.conns, nc)
	s.mu.Unlock()
}

// Shutdown closes the listeners and stops taking streams: each connection gets a
// GOAWAY naming its last stream, and is closed once its calls are
// answered; connections not yet past their first call are closed at once.
// It returns when every connection has ended, or with ctx's error when ctx
// ends first (Close then ends the rest).
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.beginShutdownLocked()
	var cs []*conn
	for nc, c := range s.conns {
		if c == nil {
			nc.Close()
			continue
		}
		cs = append(cs, c)
	}
	s.mu.Unlock()
	// Why goroutines, outside s.mu: goAway takes a connection's lock, which
	// a write to a client that does not read holds for up to RecvTimeout;
	// Shutdown must still end with ctx, and Close not wait for s.mu.
	for _, c := range cs {
		go c.goAway()
	}
	ended := make(chan struct{})
	go func() { s.wg.Wait(); close(ended) }()
	select {
	case <-ended:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("h2grpc: shutdown: %w", ctx.Err())
	}
}

// beginShutdownLocked refuses new connections and closes the listeners.
func (s *Server) beginShutdownLocked() {
	if s.shutdown {
		return
	}
	s.shutdown = true
	close(s.done)
	for _, ln := range s.lns {
		ln.Close()
	}
}

// Close closes every connection at once, cancelling the calls in flight,
// and waits for the connections' readers to return.
func (s *Server) Close() {
	s.mu.Lock()
	s.beginShutdownLocked()
	for nc := range s.conns {
		nc.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// dispatch hands a call to an idle worker, or to a new one.
func (s *Server) dispatch(st *call, ctx context.Context) {
	select {
	case s.work <- work{st, ctx}:
	default:
		go s.worker(work{st, ctx})
	}
}

// work is a call for a worker, with its context.
type work struct {
	st  *call
	ctx context.Context
}

// worker answers w, then waits for more while fewer than maxIdle others
// wait, until the server shuts down.
func (s *Server) worker(w work) {
	for {
		w.st.run(w.ctx, false)
		if s.idle.Add(1) > int32(s.maxIdle) {
			s.idle.Add(-1)
			return
		}
		select {
		case w = <-s.work:
			s.idle.Add(-1)
		case <-s.done:
			s.idle.Add(-1)
			return
		}
	}
}
