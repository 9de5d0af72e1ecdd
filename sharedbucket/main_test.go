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
