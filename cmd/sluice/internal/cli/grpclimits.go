package cli

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// Defaults of GRPCLimits, chosen to match what the HTTP port allows (see
// RunServer) where the two have a counterpart.
const (
	// DefaultGRPCMaxStreams is the concurrent streams a connection may
	// have: the floor RFC 9113 recommends for SETTINGS_MAX_CONCURRENT_STREAMS.
	// A client (Envoy's connection pool) that needs more opens another
	// connection.
	DefaultGRPCMaxStreams = 100
	// DefaultGRPCRecvTimeout bounds a call from its headers to its answer,
	// as the HTTP port's 10 s body deadline and write timeout do.
	DefaultGRPCRecvTimeout = 10 * time.Second
	// DefaultGRPCMaxRequestBytes is the largest request message: 64 KiB,
	// above Envoy's default limit on a request's headers (60 KiB), from
	// which it builds descriptors, so a request describing one HTTP
	// request fits; the 4 MiB of grpc-go's default let 16 calls take 900
	// MiB.
	DefaultGRPCMaxRequestBytes = 64 << 10
	// DefaultGRPCInFlightBytes bounds the requests in flight server-wide,
	// each counted at MaxRequestBytes: 64 MiB, 1024 streams at the default
	// request size.
	DefaultGRPCInFlightBytes = 64 << 20
	// MaxGRPCInFlightRequests bounds InFlightBytes / MaxRequestBytes, the
	// requests in flight at once. Why: the budget keeps a place (8 bytes)
	// per request, allocated up front and swept in turn; a tiny request
	// size under a huge in-flight figure (taken for "no limit") asked for
	// gigabytes, or more than the host has, at start.
	MaxGRPCInFlightRequests = 1 << 20
	// DefaultGRPCIdleTimeout closes a connection without streams for this
	// long, as the HTTP port's IdleTimeout.
	DefaultGRPCIdleTimeout = 2 * time.Minute
)

// GRPCLimits bound what the clients of the gRPC port (WithGRPCLimits) can
// hold. A zero field takes its default; a negative one is an error.
type GRPCLimits struct {
	// MaxStreams caps the concurrent streams of one connection
	// (DefaultGRPCMaxStreams), advertised in SETTINGS_MAX_CONCURRENT_STREAMS;
	// a stream past it is refused with RST_STREAM REFUSED_STREAM.
	MaxStreams uint32
	// RecvTimeout bounds a call from its headers to its answer
	// (DefaultGRPCRecvTimeout), whatever deadline the client asks for (a
	// shorter one still holds); a call cut by it gets DEADLINE_EXCEEDED.
	// A streaming call (the health service's Watch) is bounded until its
	// request has arrived (CANCELLED if it has not), then lives as long as
	// the client wants.
	RecvTimeout time.Duration
	// MaxRequestBytes caps a request message (DefaultGRPCMaxRequestBytes);
	// a larger one gets RESOURCE_EXHAUSTED.
	MaxRequestBytes int
	// InFlightBytes caps the requests in flight server-wide, a stream
	// counted at MaxRequestBytes (all it can bring) from its headers until
	// it ends, or, for a streaming call, until its request has arrived
	// (DefaultGRPCInFlightBytes). A stream past it gets RESOURCE_EXHAUSTED
	// at once, before any of its message is read.
	InFlightBytes int64
	// Transport serves the port: "sluice" (or empty) for the h2grpc
	// transport, connections whose first call is not a unary method handed
	// to grpc-go; "grpc-go" for grpc-go alone.
	Transport string
	// IdleTimeout closes a connection that has had no stream for this long
	// (DefaultGRPCIdleTimeout); the server also pings a connection quiet
	// for this long and closes it if no answer comes within 20 s, so a
	// vanished client's connection does not stay.
	IdleTimeout time.Duration
}

// withDefaults fills zero fields and checks the others.
func (l GRPCLimits) withDefaults() (GRPCLimits, error) {
	switch {
	case l.RecvTimeout < 0:
		return l, fmt.Errorf("gRPC receive timeout %v: must not be negative", l.RecvTimeout)
	case l.MaxRequestBytes < 0:
		return l, fmt.Errorf("gRPC max request size %d: must not be negative", l.MaxRequestBytes)
	case l.InFlightBytes < 0:
		return l, fmt.Errorf("gRPC in-flight bytes %d: must not be negative", l.InFlightBytes)
	case l.Transport != "" && l.Transport != "sluice" && l.Transport != "grpc-go":
		return l, fmt.Errorf("gRPC transport %q: want sluice or grpc-go", l.Transport)
	case l.IdleTimeout < 0:
		return l, fmt.Errorf("gRPC idle timeout %v: must not be negative", l.IdleTimeout)
	}
	if l.MaxStreams == 0 {
		l.MaxStreams = DefaultGRPCMaxStreams
	}
	if l.RecvTimeout == 0 {
		l.RecvTimeout = DefaultGRPCRecvTimeout
	}
	if l.MaxRequestBytes == 0 {
		l.MaxRequestBytes = DefaultGRPCMaxRequestBytes
	}
	if l.InFlightBytes == 0 {
		l.InFlightBytes = DefaultGRPCInFlightBytes
	}
	if l.IdleTimeout == 0 {
		l.IdleTimeout = DefaultGRPCIdleTimeout
	}
	if l.InFlightBytes < int64(l.MaxRequestBytes) {
		return l, fmt.Errorf("gRPC in-flight bytes %d: below the max request size %d, no request could come in", l.InFlightBytes, l.MaxRequestBytes)
	}
	if n := l.InFlightBytes / int64(l.MaxRequestBytes); n > MaxGRPCInFlightRequests {
		return l, fmt.Errorf("gRPC in-flight bytes %d admit %d requests of %d bytes at once, over the %d maximum",
			l.InFlightBytes, n, l.MaxRequestBytes, MaxGRPCInFlightRequests)
	}
	return l, nil
}

// grpcBounds enforces a GRPCLimits on a grpc.Server: the options it
// returns, and its health service wrapper (healthWatch).
type grpcBounds struct {
	lim    GRPCLimits
	budget *streamBudget
	// streaming are the full method names of the streaming calls served:
	// they get RecvTimeout until their request has arrived (watchDeadline)
	// instead of for their whole life. Written before Serve, read-only
	// after.
	streaming map[string]bool
}

func newGRPCBounds(lim GRPCLimits) (*grpcBounds, error) {
	lim, err := lim.withDefaults()
	if err != nil {
		return nil, err
	}
	return &grpcBounds{lim: lim, budget: newStreamBudget(int(lim.InFlightBytes / int64(lim.MaxRequestBytes))),
		streaming: map[string]bool{}}, nil
}

// options are the server options that apply b.
func (b *grpcBounds) options() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(b.lim.MaxStreams),
		grpc.MaxRecvMsgSize(b.lim.MaxRequestBytes),
		// Why a tap handle: it is the one hook grpc-go calls for a stream
		// before its reader is set up, so a context it returns is the one a
		// wait for the request watches. A stats handler's context (TagRPC)
		// comes later and reaches the handler only: cancelling it leaves
		// the goroutine waiting for a message that never comes.
		grpc.InTapHandle(b.tap),
		// Why: Envoy keeps one long-lived HTTP/2 connection per worker
		// and may ping it; allow pings without streams rather than
		// closing the connection with GOAWAY "too_many_pings".
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: b.lim.IdleTimeout,
			Time:              b.lim.IdleTimeout,
			Timeout:           20 * time.Second,
		}),
	}
}

// learn records which methods of g stream; call it once every service is
// registered, before Serve.
func (b *grpcBounds) learn(g *grpc.Server) {
	for name, si := range g.GetServiceInfo() {
		for _, m := range si.Methods {
			if m.IsClientStream || m.IsServerStream {
				b.streaming["/"+name+"/"+m.Name] = true
			}
		}
	}
}

// errInFlight is the answer to a stream past InFlightBytes.
var errInFlight = status.Error(codes.ResourceExhausted, "sluice: too many requests in flight, try again")

// tap admits a new stream and bounds the time to receive its request. It
// runs on the connection's reader, under the transport's lock: it must not
// block.
func (b *grpcBounds) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if b.streaming[info.FullMethodName] {
		w := &watchDeadline{released: make(chan struct{})}
		if !b.budget.admit(w.released) {
			return nil, errInFlight
		}
		ctx, w.cancel = context.WithCancel(ctx)
		w.timer = time.AfterFunc(b.lim.RecvTimeout, w.expire)
		return context.WithValue(ctx, watchKey{}, w), nil
	}
	// The stream's context is done when the stream ends, however it
	// ends: the budget takes its place back then.
	if !b.budget.admit(ctx.Done()) {
		return nil, errInFlight
	}
	// Why the check: Envoy sends its filter's timeout (20 ms by default)
	// as grpc-timeout, and grpc-go then ends the stream at that deadline
	// itself; a call that asks for no more than RecvTimeout costs nothing
	// here (no context, no timer).
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= b.lim.RecvTimeout {
		return ctx, nil
	}
	ctx, cancel := context.WithTimeout(ctx, b.lim.RecvTimeout)
	// Why cancel is not called: grpc-go cancels the stream's context when
	// the stream ends, which cancels this child and stops its timer.
	_ = cancel
	return ctx, nil
}

// watchKey is the context key of a streaming call's watchDeadline.
type watchKey struct{}

// watchDeadline cancels a streaming call whose request has not arrived by
// RecvTimeout, and holds its place in the stream budget until then.
type watchDeadline struct {
	cancel   context.CancelFunc
	timer    *time.Timer
	released chan struct{} // closed once: request received or deadline passed
	once     sync.Once
}

func (w *watchDeadline) expire() {
	w.cancel()
	w.release()
}

// received disarms the deadline: the call's request has arrived. If the
// deadline has passed already, the call's context is cancelled anyway.
func (w *watchDeadline) received() {
	w.timer.Stop()
	w.release()
}

func (w *watchDeadline) release() { w.once.Do(func() { close(w.released) }) }

// streamInterceptor disarms a streaming call's receive deadline once its
// first message has arrived.
func streamInterceptor(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	w, _ := ss.Context().Value(watchKey{}).(*watchDeadline)
	if w == nil {
		return handler(srv, ss)
	}
	return handler(srv, &firstRecv{ServerStream: ss, w: w})
}

// firstRecv tells its watchDeadline when the first message has arrived.
type firstRecv struct {
	grpc.ServerStream
	w    *watchDeadline
	done bool
}

func (s *firstRecv) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil && !s.done {
		s.done = true
		s.w.received()
	}
	return err
}

// streamBudget admits at most n streams at once. A stream holds its place
// until the channel it was admitted with is closed (its context's Done).
// It is safe for concurrent use; admit never blocks.
//
// Why places are taken back lazily, by an admission that finds none free,
// and not when a stream ends: grpc-go has no per-stream end hook that costs
// nothing (a stats handler allocates an event per step of every call,
// context.AfterFunc starts a goroutine per call), while a closed channel
// costs nothing to leave and little to check.
type streamBudget struct {
	mu      sync.Mutex
	held    []<-chan struct{} // len + counted ≤ cap = n
	counted int               // places taken by admitCounted and not released
	// noSweepUntil: after a sweep that freed little, refuse without
	// sweeping again until then, so that a client holding the whole
	// budget cannot make every refused stream cost a sweep.
	noSweepUntil time.Time
}

// budgetSweepGap is how long a full budget whose last sweep freed under an
// eighth of it refuses streams without sweeping again.
const budgetSweepGap = time.Millisecond

func newStreamBudget(n int) *streamBudget {
	return &streamBudget{held: make([]<-chan struct{}, 0, n)}
}

// admit takes a place for a stream whose end closes done, if one is free.
func (b *streamBudget) admit(done <-chan struct{}) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.held)+b.counted == cap(b.held) && !b.sweep() {
		return false
	}
	b.held = append(b.held, done)
	return true
}

// admitCounted takes a place for a stream that gives it back itself
// (releaseCounted), if one is free: the streams of the h2grpc transport,
// which knows when each ends.
func (b *streamBudget) admitCounted() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.held)+b.counted == cap(b.held) && !b.sweep() {
		return false
	}
	b.counted++
	return true
}

// releaseCounted gives back a place admitCounted took.
func (b *streamBudget) releaseCounted() {
	b.mu.Lock()
	b.counted--
	b.mu.Unlock()
}

// sweep drops the places of ended streams; it reports whether one is free.
func (b *streamBudget) sweep() bool {
	now := time.Now()
	if now.Before(b.noSweepUntil) {
		return false
	}
	keep := b.held[:0]
	for _, d := range b.held {
		select {
		case <-d:
		default:
			keep = append(keep, d)
		}
	}
	clear(b.held[len(keep):]) // let the channels go
	freed := len(b.held) - len(keep)
	b.held = keep
	if freed < cap(b.held)/8+1 {
		b.noSweepUntil = now.Add(budgetSweepGap)
	}
	return freed > 0
}
