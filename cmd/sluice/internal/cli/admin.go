package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/sluice-go/sluice/cmd/sluice/service"
)

// WithAdmin serves the service's admin endpoints (/stats, /metrics,
// /healthz: service.Server.AdminHandler) on addr, over TLS when ctx carries
// certificates (WithCerts), with the decision port's timeouts. Run it with
// service.Config.SplitAdmin so that they leave the decision port. ready, if
// non-nil, is called with the bound address.
func WithAdmin(addr string, ready func(net.Addr)) ServeExtra {
	return func(ctx context.Context, srv *service.Server, log *slog.Logger) (func(), error) {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("-admin-addr: %w", err)
		}
		certs := certsFrom(ctx)
		hs := &http.Server{
			Handler:           srv.AdminHandler(),
			ReadHeaderTimeout: 5 * time.Second,
			WriteTimeout:      10 * time.Second,
			IdleTimeout:       2 * time.Minute,
			MaxHeaderBytes:    16 << 10,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		}
		log.Info("admin listening", "addr", ln.Addr().String(), "tls", tlsMode(certs))
		if ready != nil {
			ready(ln.Addr())
		}
		errc := make(chan error, 1)
		if certs != nil {
			hs.TLSConfig = certs.Config("h2", "http/1.1")
			go func() { errc <- hs.ServeTLS(ln, "", "") }()
		} else {
			go func() { errc <- hs.Serve(ln) }()
		}
		return func() {
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = hs.Shutdown(sctx)
			if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("admin serve failed", "err", err)
			}
		}, nil
	}
}
