package sharedbucket

import (
	"fmt"
	"os"
)

// childEnv selects a child role when the test binary is re-executed.
const childEnv = "SLUICE_SHAREDBUCKET_CHILD"

// runChild runs one child role and returns its exit code.
func runChild(role string) int {
	switch role {
	default:
		fmt.Fprintf(os.Stderr, "unknown child role %q\n", role)
		return 2
	}
}
