// Package cli implements the sluice command's subcommands (serve, client,
// demo). cmd/sluice only wires signals and os.Args to Main.
package cli

import (
	"context"
	"fmt"
	"io"
)

const usage = `usage: sluice <command> [flags]

commands:
  demo     run a server and three replicas for a few seconds and show the shared limit hold
  serve    run the global rate-limit service (HTTP; Envoy's gRPC with -grpc)
  client   play one replica that asks the service before each unit of work
  version  print the version, commit and Go toolchain of this build

Run "sluice <command> -h" for a command's flags.
`

// Main runs the subcommand named by args[0] and returns the process exit
// code: 0 on success, 2 on bad usage or flags, 1 on a runtime failure. It
// returns when the command is done or ctx is cancelled (a signal).
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		_, _ = io.WriteString(stderr, usage)
		return 2
	}
	switch args[0] {
	case "serve":
		return Serve(ctx, args[1:], stdout, stderr)
	case "client":
		return Client(ctx, args[1:], stdout, stderr)
	case "demo":
		return Demo(ctx, args[1:], stdout, stderr)
	case "version", "-version", "--version":
		return versionCmd(args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		_, _ = io.WriteString(stdout, usage)
		return 0
	default:
		_, _ = fmt.Fprintf(stderr, "sluice: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}
