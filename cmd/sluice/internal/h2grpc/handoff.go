package h2grpc

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"

	"google.golang.org/grpc/credentials"
)

// Listener is a net.Listener whose connections are the ones a Server hands
// over (give Server.Handoff its Put): serve a grpc.Server on it, with
// Creds when the Server speaks TLS. It is safe for concurrent use.
type Listener struct {
	addr  net.Addr
	conns chan net.Conn
	once  sync.Once
	done  chan struct{}
}

// NewListener returns a Listener reporting addr as its address.
func NewListener(addr net.Addr) *Listener {
	return &Listener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

// Put hands c to Accept; once the listener is closed, c is closed instead.
func (l *Listener) Put(c net.Conn) {
	select {
	case l.conns <- c:
	case <-l.done:
		c.Close()
	}
}

// Accept implements net.Listener.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr implements net.Listener.
func (l *Listener) Addr() net.Addr { return l.addr }

// Creds are grpc-go transport credentials for connections a Server has
// handed over after their TLS handshake: they report the handshake's state
// (the client's verified chains) as credentials.TLSInfo, as grpc-go's own
// TLS credentials do, and do no handshake of their own.
func Creds() credentials.TransportCredentials { return handedOver{} }

type handedOver struct{}

func (handedOver) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("h2grpc: handed-over credentials are for a server")
}

func (handedOver) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	inner := c
	if rc, ok := c.(*replayConn); ok {
		inner = rc.Conn
	}
	tc, ok := inner.(*tls.Conn)
	if !ok {
		return c, insecureInfo{credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
	}
	return c, credentials.TLSInfo{State: tc.ConnectionState(),
		CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}, nil
}

func (handedOver) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls"}
}
func (h handedOver) Clone() credentials.TransportCredentials { return h }
func (handedOver) OverrideServerName(string) error           { return nil }

// insecureInfo is the AuthInfo of a connection without TLS, as grpc-go's
// insecure credentials report it.
type insecureInfo struct{ credentials.CommonAuthInfo }

func (insecureInfo) AuthType() string { return "insecure" }
