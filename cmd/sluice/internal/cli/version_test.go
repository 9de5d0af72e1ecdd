package cli_test

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/sluice-go/sluice/cmd/sluice/internal/cli"
)

// What `sluice version` says for each way of building the command: the
// version and the commit wherever the build can know it, and plainly that it
// cannot where it cannot.
func TestVersionOf(t *testing.T) {
	root := &debug.Module{Path: "github.com/sluice-go/sluice", Version: "v0.1.0"}
	for _, tc := range []struct {
		name string
		bi   debug.BuildInfo
		want []string
	}{{
		name: "go install @tag",
		bi:   debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v0.1.0"}, Deps: []*debug.Module{root}},
		want: []string{"sluice v0.1.0 ", "commit tagged cmd/sluice/v0.1.0", "library v0.1.0", "go1.26.0"},
	}, {
		name: "go install @commit (pseudo-version)",
		bi:   debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v0.1.1-0.20261206152400-0123456789ab"}, Deps: []*debug.Module{root}},
		want: []string{"sluice v0.1.1-0.20261206152400-0123456789ab ", "commit 0123456789ab", "library v0.1.0"},
	}, {
		name: "checkout with VCS stamping",
		bi: debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "fedcba9876543210fedcba9876543210fedcba98"},
			{Key: "vcs.time", Value: "2026-12-06T15:24:00Z"},
			{Key: "vcs.modified", Value: "true"},
		}},
		want: []string{"sluice (devel) ", "commit fedcba987654+dirty, 2026-12-06T15:24:00Z"},
	}, {
		name: "checkout with -buildvcs=false",
		bi:   debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}},
		want: []string{"sluice (devel) ", "no commit recorded"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := cli.VersionOf(&tc.bi)
			for _, w := range tc.want {
				assert.Contains(t, got, w)
			}
		})
	}
}
