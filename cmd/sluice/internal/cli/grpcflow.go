package cli

import "google.golang.org/grpc"

// Flow-control windows of the gRPC server: a stream may have grpcStreamWindow
// bytes of request in flight, a connection grpcConnWindow over all its
// streams.
//
// Why fixed windows: with grpc-go's default (dynamic) flow control, the
// server estimates each connection's bandwidth-delay product by sending a
// PING with a WINDOW_UPDATE each time request data arrives while no such
// PING is out, that is about once per call when a connection carries one
// call at a time (as Envoy's and most RLS clients' do), and it reads the
// client's PING ack back. A rate-limit request is a few hundred bytes, so
// the estimate never grows the window; it only costs frames, allocations
// and wake-ups on every call. Fixed windows turn the estimator off (and
// bound what a client can have unread, where the dynamic window may grow to
// 16 MiB).
//
// Why these sizes: the stream window is HTTP/2's default (64 KiB), far
// above a request; the connection's lets 16 such streams fill theirs at
// once.
const (
	grpcStreamWindow = 64 << 10
	grpcConnWindow   = 1 << 20
)

// grpcFlowControl is the gRPC server's flow-control options (see
// grpcStreamWindow).
func grpcFlowControl() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.StaticStreamWindowSize(grpcStreamWindow),
		grpc.StaticConnWindowSize(grpcConnWindow),
	}
}
