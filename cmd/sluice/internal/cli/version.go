package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
)

// Version describes this build from its Go build info; see [VersionOf].
func Version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return fmt.Sprintf("sluice (no build info) %s %s/%s", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	}
	return VersionOf(bi)
}

// rootModule is the library module the command is built on.
const rootModule = "github.com/sluice-go/sluice"

// pseudoRev matches the commit at the end of a pseudo-version
// (v0.0.0-20261206152400-0123456789ab, v0.1.1-0.20261206152400-0123456789ab).
var pseudoRev = regexp.MustCompile(`[-.]\d{14}-([0-9a-f]{12})(\+[a-z]+)?$`)

// tagged matches a release version (v1.2.3, v1.2.3-rc.1); checked after
// pseudoRev, which it also matches.
var tagged = regexp.MustCompile(`^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$`)

// VersionOf describes a build: the module version, the commit, the library
// version it was built with, and the Go toolchain. The commit comes from where
// the build recorded it, and no commit is made up:
//   - go install …@vX.Y.Z: the build info holds the version only; the commit
//     is the one the tag cmd/sluice/vX.Y.Z names (RELEASING.md), and it says so;
//   - go install …@COMMIT or a branch: the version is a pseudo-version, which
//     ends with the commit's first 12 hex digits;
//   - a checkout (go build, go run): "(devel)" or a pseudo-version, and
//     vcs.revision, vcs.time and vcs.modified when the go command stamped
//     them (-buildvcs, on by default in a git checkout);
//   - otherwise it says "no commit recorded".
func VersionOf(bi *debug.BuildInfo) string {
	ver := bi.Main.Version
	if ver == "" {
		ver = "(devel)"
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
	var parts []string
	switch m := pseudoRev.FindStringSubmatch(ver); {
	case rev != "":
		c := fmt.Sprintf("commit %.12s%s", rev, dirty)
		if at != "" {
			c += ", " + at
		}
		parts = append(parts, c)
	case m != nil:
		parts = append(parts, "commit "+m[1])
	case tagged.MatchString(ver):
		// A tagged release: the build info holds no commit, but the tag
		// names exactly one.
		parts = append(parts, "the commit tagged cmd/sluice/"+ver)
	default:
		parts = append(parts, "no commit recorded")
	}
	for _, d := range bi.Deps {
		if d.Path == rootModule {
			lib := "library " + d.Version
			if d.Replace != nil {
				lib += " => " + d.Replace.Path
				if d.Replace.Version != "" {
					lib += " " + d.Replace.Version
				}
			}
			parts = append(parts, lib)
		}
	}
	return fmt.Sprintf("sluice %s (%s) %s %s/%s", ver, strings.Join(parts, "; "), bi.GoVersion, runtime.GOOS, runtime.GOARCH)
}

// versionCmd runs `sluice version`: it takes no flags and no arguments, and
// -h prints its usage instead of the version.
func versionCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sluice version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		_, _ = fmt.Fprint(fs.Output(), "usage: sluice version\n\nPrints the version of this build, its commit (recorded by a checkout build,\nthe last part of a pseudo-version, or the one a release tag cmd/sluice/vX.Y.Z\nnames; \"no commit recorded\" otherwise), the library version and the Go toolchain.\n")
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
