// Package schedtest explores the schedules of fiber code: it runs a test
// body under many seeds of sched.WithSeed and, when one fails, says how to
// replay exactly that schedule.
//
// A seed fixes the order in which fibers runnable at the same instant run,
// and the order of timers due at the same instant; everything else about a
// virtual run is already deterministic. So a body whose only nondeterminism
// is the schedule fails or passes the same way every time for a given seed,
// and a failure found on seed 731 out of 1,000 replays on seed 731 alone,
// under a debugger or with extra logging.
//
//	func TestQueue(t *testing.T) {
//		schedtest.Explore(t, 1000, func(t *testing.T, seed uint64) {
//			err := sched.Run(context.Background(), func(ctx context.Context) error {
//				... fibers, waits, assertions ...
//			}, sched.Virtual(time.Time{}), sched.WithSeed(seed))
//			require.NoError(t, err)
//		})
//	}
//
// A failure reads, for example:
//
//	schedtest: seed 731 of 1000 failed; replay it alone with
//	    SLUICE_SEED=731 go test -run '^TestQueue$' ./queue
//
// The environment variables:
//
//	SLUICE_SEED=k      run only seed k (replay)
//	SLUICE_EXPLORE=n   run n seeds instead of the count in the code
//	                   (explore further on a nightly build)
package schedtest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The environment variables Explore reads.
const (
	EnvSeed    = "SLUICE_SEED"    // a single seed to replay
	EnvExplore = "SLUICE_EXPLORE" // how many seeds to run, overriding n
)

// Explore runs body once per seed, as subtests named "seed=1" to "seed=n",
// and stops at the first seed whose subtest fails, reporting that seed and a
// command line that reruns exactly it. body should pass seed to
// sched.WithSeed (and may derive its own random choices, such as which
// fiber to cancel, from it: they replay too). With SLUICE_SEED set, Explore
// runs that seed alone; with SLUICE_EXPLORE set, it runs that many seeds
// instead of n. Explore panics if n < 1 or an environment variable does not
// parse: both are mistakes in the test's setup.
func Explore(t *testing.T, n int, body func(t *testing.T, seed uint64)) {
	t.Helper()
	if n < 1 {
		panic(fmt.Sprintf("schedtest: Explore with n = %d, want at least 1", n))
	}
	if s, ok := os.LookupEnv(EnvSeed); ok {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			panic(fmt.Sprintf("schedtest: %s=%q is not a seed: %v", EnvSeed, s, err))
		}
		t.Run(SubtestName(seed), func(t *testing.T) { body(t, seed) })
		return
	}
	if s, ok := os.LookupEnv(EnvExplore); ok {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			panic(fmt.Sprintf("schedtest: %s=%q is not a positive count", EnvExplore, s))
		}
		n = v
	}
	for i := 1; i <= n; i++ {
		seed := uint64(i)
		if !t.Run(SubtestName(seed), func(t *testing.T) { body(t, seed) }) {
			t.Errorf("schedtest: seed %d of %d failed; replay it alone with\n\t%s", seed, n, Rerun(t, seed))
			return
		}
	}
}

// SubtestName is the name of the subtest Explore runs for seed.
func SubtestName(seed uint64) string { return "seed=" + strconv.FormatUint(seed, 10) }

// Rerun returns the shell command that replays seed in test t, run from the
// module's root: SLUICE_SEED=seed go test -run '<t's name>' ./<package>.
func Rerun(t testing.TB, seed uint64) string {
	return fmt.Sprintf("%s=%d go test -run '%s' %s", EnvSeed, seed, runPattern(t.Name()), packageDir())
}

// runPattern anchors each element of a test's name, so that -run selects
// that test alone.
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// packageDir is the directory of the package under test (go test runs a
// test binary in it) relative to the root of its module, or "." when that
// cannot be told.
func packageDir() string {
	wd, err := os.Getwd()
	if err != nil {
		return "."
	}
	for dir := wd; ; {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			rel, err := filepath.Rel(dir, wd)
			if err != nil || rel == "." {
				return "."
			}
			return "./" + filepath.ToSlash(rel)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "."
		}
		dir = parent
	}
}
