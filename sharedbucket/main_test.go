//go:build linux || darwin

package sharedbucket

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// A child role (see child_test.go) runs instead of the tests when the
	// parent re-executes this binary.
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(runChild(role))
	}
	goleak.VerifyTestMain(m)
}

// tmpfsDir returns a fresh directory on tmpfs (/dev/shm) when there is one,
// as tables live in production, else t.TempDir(). It is removed at cleanup.
func tmpfsDir(tb testing.TB) string {
	tb.Helper()
	if usableDir("/dev/shm") {
		d, err := os.MkdirTemp("/dev/shm", "sluice-test-")
		if err == nil {
			tb.Cleanup(func() { os.RemoveAll(d) })
			return d
		}
	}
	return tb.TempDir()
}
