package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Certs are the TLS certificate `sluice serve` presents on both ports and,
// for mutual TLS, the CAs that must have signed a client's certificate. They
// are read from files at start and read again by Reload; a reload changes
// what new handshakes see and leaves connections already open alone. A
// reload that fails keeps the certificates in force. Certs is safe for
// concurrent use.
type Certs struct {
	certFile, keyFile, caFile string
	cur                       atomic.Pointer[certState]
}

// certState is one reading of the files.
type certState struct {
	cert  tls.Certificate
	cas   *x509.CertPool // nil: no -client-ca, no client certificate asked
	stamp string         // the files' sizes and modification times when read
}

// LoadCerts reads a certificate and its key (PEM) and, when caFile is not
// empty, the CA certificates (PEM) that client certificates must chain to.
// Its errors name the flag and the file.
func LoadCerts(certFile, keyFile, caFile string) (*Certs, error) {
	switch {
	case certFile == "" && keyFile == "":
		return nil, errors.New("-tls-cert and -tls-key: both are needed")
	case certFile == "":
		return nil, errors.New("-tls-key needs -tls-cert")
	case keyFile == "":
		return nil, errors.New("-tls-cert needs -tls-key")
	}
	c := &Certs{certFile: certFile, keyFile: keyFile, caFile: caFile}
	s, err := c.read()
	if err != nil {
		return nil, err
	}
	c.cur.Store(s)
	return c, nil
}

func (c *Certs) read() (*certState, error) {
	stamp := c.stamp() // before reading: a change during the read shows as one more
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return nil, fmt.Errorf("-tls-cert %s, -tls-key %s: %w", c.certFile, c.keyFile, err)
	}
	s := &certState{cert: cert, stamp: stamp}
	if c.caFile != "" {
		pem, err := os.ReadFile(c.caFile)
		if err != nil {
			return nil, fmt.Errorf("-client-ca: %w", err)
		}
		s.cas = x509.NewCertPool()
		if !s.cas.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-client-ca %s: no PEM certificate in the file", c.caFile)
		}
	}
	return s, nil
}

// stamp identifies a version of the files: each one's size and modification
// time, or its error.
func (c *Certs) stamp() string {
	var b strings.Builder
	for _, f := range []string{c.certFile, c.keyFile, c.caFile} {
		if f == "" {
			continue
		}
		fi, err := os.Stat(f)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", f, err)
			continue
		}
		fmt.Fprintf(&b, "%s %d %d\n", f, fi.Size(), fi.ModTime().UnixNano())
	}
	return b.String()
}

// Reload reads the files again. On an error the certificates in force stay,
// and the error says which file is at fault.
func (c *Certs) Reload() error {
	s, err := c.read()
	if err != nil {
		return err
	}
	c.cur.Store(s)
	return nil
}

// Mutual reports whether clients must present a certificate (-client-ca).
func (c *Certs) Mutual() bool { return c.caFile != "" }

// Config is a server tls.Config offering nextProtos in ALPN (for example
// "h2" for gRPC) that takes the certificates in force at each handshake.
// With a client CA, a client must present a certificate that chains to it.
func (c *Certs) Config(nextProtos ...string) *tls.Config {
	// Why GetConfigForClient and not GetCertificate alone: the client CAs
	// must change with a reload too, and a tls.Config's ClientCAs cannot
	// be swapped under a live server; a config built per handshake can.
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: nextProtos,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			s := c.cur.Load()
			cfg := &tls.Config{
				MinVersion:   tls.VersionTLS12,
				NextProtos:   nextProtos,
				Certificates: []tls.Certificate{s.cert},
			}
			if s.cas != nil {
				cfg.ClientAuth = tls.RequireAndVerifyClientCert
				cfg.ClientCAs = s.cas
			}
			return cfg, nil
		},
	}
}

// Watch reloads the certificates each time sig delivers and, when poll > 0,
// when a check every poll finds a file's size or modification time changed
// and the next check finds the same (a file is briefly half written while
// it is replaced; kubelet swaps a Secret's files). It logs each outcome and
// returns a function that stops it.
func (c *Certs) Watch(sig <-chan os.Signal, poll time.Duration, log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var tick <-chan time.Time
	stopTicker := func() {}
	if poll > 0 {
		t := time.NewTicker(poll)
		tick, stopTicker = t.C, t.Stop
	}
	reload := func() {
		if err := c.Reload(); err != nil {
			log.Error("tls certificates reload failed; keeping the certificates in force", "err", err)
			return
		}
		log.Info("tls certificates reloaded", "cert", c.certFile, "client_ca", c.caFile)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		last := c.cur.Load().stamp
		pending := last
		for {
			select {
			case <-ctx.Done():
				return
			case <-sig:
				last = c.stamp()
				pending = last
				reload()
			case <-tick:
				now := c.stamp()
				if now != last && now == pending {
					last = now
					reload()
				}
				pending = now
			}
		}
	})
	return func() { cancel(); wg.Wait(); stopTicker() }
}

// certsKey is the context key under which Serve hands its Certs to
// RunServer and WithGRPC.
type certsKey struct{}

// WithCerts returns ctx carrying c: RunServer then serves HTTPS and WithGRPC
// gRPC over TLS, both with c's certificates. Why through ctx: the
// certificates belong to the run as the ctx does, and RunServer's callers
// without TLS (the demo, tests) stay as they are.
func WithCerts(ctx context.Context, c *Certs) context.Context {
	return context.WithValue(ctx, certsKey{}, c)
}

func certsFrom(ctx context.Context) *Certs {
	c, _ := ctx.Value(certsKey{}).(*Certs)
	return c
}
