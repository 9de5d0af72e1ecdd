package cli

import (
	"context"

	"github.com/sluice-go/sluice/cmd/sluice/service"
)

// startUI runs the sampler of the page at /ui (service.Server.RunUI: one
// sample a second, the per-second rates and 15 minutes of history) until
// ctx ends or the returned stop is called; stop waits for it.
func startUI(ctx context.Context, srv *service.Server) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.RunUI(ctx)
	}()
	return func() { cancel(); <-done }
}
