// Command sluice runs the global rate-limit service and its companions:
//
//	sluice demo     a server and three replicas sharing one limit, in a few seconds
//	sluice serve    the HTTP service (/allow, /stats, /healthz, /metrics) and,
//	                with -grpc, Envoy's rate-limit gRPC service
//	sluice client   one replica asking the service before each unit of work
//	sluice version  the version, commit and Go toolchain of this build
//
// The logic lives in internal/cli; main only wires signals and arguments.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluice-go/sluice/cmd/sluice/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
