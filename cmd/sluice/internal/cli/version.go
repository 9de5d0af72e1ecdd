package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// Version describes this build from the Go build info: the module version
// ("v1.2.0" when installed with go install …@v1.2.0, "(devel)" when built
// from a checkout), the commit and its time when the build recorded them,
// and the Go toolchain.
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return fmt.Sprintf("sluice (no build info) %s %s/%s", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	}
	v := "sluice " + bi.Main.Version
	if v == "sluice " {
		v += "(devel)"
	}
	var rev, at, dirty string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if rev != "" {
		v += fmt.Sprintf(" (commit %.12s%s, %s)", rev, dirty, at)
	}
	return fmt.Sprintf("%s %s %s/%s", v, bi.GoVersion, runtime.GOOS, runtime.GOARCH)
}

// versionCmd runs `sluice version`: it takes no flags and no arguments, and
// -h prints its usage instead of the version.
func versionCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sluice version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		_, _ = fmt.Fprint(fs.Output(), "usage: sluice version\n\nPrints the version, commit and Go toolchain of this build.\n")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		_, _ = fmt.Fprintf(stderr, "sluice version: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return 2
	}
	_, _ = fmt.Fprintln(stdout, Version())
	return 0
}
