package schedtest_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/sched"
	"github.com/sluice-go/sluice/sched/schedtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fetchTwice is a deliberately racy cache fill: a check-then-act across a
// Yield (standing for I/O). The first reader finds the cache empty, yields
// while it "fetches", then stores; a second reader that does a little work
// first checks the cache too. Under FIFO the first reader always stores
// before the second one checks, so the bug hides; another order of the same
// runnable fibers makes both fetch. It returns how many fetches happened.
func fetchTwice(opts ...sched.Option) (int, error) {
	var cached bool
	fetches := 0
	read := func(ctx context.Context) {
		if !cached {
			fetches++
			sched.Yield(ctx) // the fetch
			cached = true
		}
	}
	err := sched.Run(context.Background(), func(ctx context.Context) error {
		sched.Go(ctx, func(ctx context.Context) error { read(ctx); return nil })
		sched.Go(ctx, func(ctx context.Context) error {
			sched.Yield(ctx) // some work first
			sched.Yield(ctx)
			read(ctx)
			return nil
		})
		return nil
	}, append(opts, sched.Virtual(time.Time{}))...)
	return fetches, err
}

// FIFO never catches the race; seeded schedules catch it within 100 seeds,
// and the failing seed replays.
func TestRacyCheckThenActCaughtBySeedsNotByFIFO(t *testing.T) {
	for range 100 {
		n, err := fetchTwice()
		require.NoError(t, err)
		require.Equal(t, 1, n, "FIFO order caught it")
	}
	caught := uint64(0)
	for seed := uint64(1); seed <= 100 && caught == 0; seed++ {
		n, err := fetchTwice(sched.WithSeed(seed))
		require.NoError(t, err)
		if n > 1 {
			caught = seed
		}
	}
	require.NotZero(t, caught, "100 seeds did not catch the double fetch")
	t.Logf("caught by seed %d", caught)
	for range 10 {
		n, err := fetchTwice(sched.WithSeed(caught))
		require.NoError(t, err)
		require.Equal(t, 2, n, "seed %d does not replay", caught)
	}
}

func TestExploreRunsEverySeedOnce(t *testing.T) {
	var seeds []uint64
	schedtest.Explore(t, 50, func(t *testing.T, seed uint64) {
		seeds = append(seeds, seed)
		n, err := fetchTwice(sched.WithSeed(seed))
		require.NoError(t, err)
		require.GreaterOrEqual(t, n, 1)
	})
	require.Len(t, seeds, 50)
	assert.Equal(t, uint64(1), seeds[0])
	assert.Equal(t, uint64(50), seeds[49])
}

func TestRerunNamesTheTestAndPackage(t *testing.T) {
	assert.Equal(t, "SLUICE_SEED=7 go test -run '^TestRerunNamesTheTestAndPackage$' ./sched/schedtest",
		schedtest.Rerun(t, 7))
	t.Run("sub test.x", func(t *testing.T) {
		assert.Equal(t, `SLUICE_SEED=9 go test -run '^TestRerunNamesTheTestAndPackage$/^sub_test\.x$' ./sched/schedtest`,
			schedtest.Rerun(t, 9))
	})
}

// The check-then-act bug under Explore, in a child process (a failing test
// cannot be watched from inside the same binary without failing it): the
// child fails at the first seed that catches it, names that seed and the
// command that replays it; that command runs that seed alone and fails the
// same way.
func TestExploreReportsAndReplaysTheFailingSeed(t *testing.T) {
	if os.Getenv("SLUICE_SCHEDTEST_CHILD") == "1" {
		schedtest.Explore(t, 100, func(t *testing.T, seed uint64) {
			n, err := fetchTwice(sched.WithSeed(seed))
			require.NoError(t, err)
			assert.Equal(t, 1, n, "fetched twice")
		})
		return
	}
	first := uint64(0)
	for seed := uint64(1); first == 0; seed++ {
		if n, _ := fetchTwice(sched.WithSeed(seed)); n > 1 {
			first = seed
		}
	}
	child := func(env ...string) string {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestExploreReportsAndReplaysTheFailingSeed$", "-test.count=1", "-test.v")
		cmd.Env = append(append(os.Environ(), "SLUICE_SCHEDTEST_CHILD=1"), env...)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "the child must fail: %s", out)
		return string(out)
	}
	out := child()
	seed := schedtest.SubtestName(first)
	assert.Contains(t, out, "--- FAIL: TestExploreReportsAndReplaysTheFailingSeed/"+seed+" ")
	assert.Contains(t, out, "fetched twice")
	assert.Contains(t, out, "schedtest: seed "+seed[len("seed="):]+" of 100 failed; replay it alone with")
	assert.Contains(t, out, "SLUICE_SEED="+seed[len("seed="):]+" go test -run '^TestExploreReportsAndReplaysTheFailingSeed$' ./sched/schedtest")
	assert.NotContains(t, out, schedtest.SubtestName(first+1)+" ", "Explore went on after the failure")

	replay := child("SLUICE_SEED=" + seed[len("seed="):])
	assert.Contains(t, replay, "--- FAIL: TestExploreReportsAndReplaysTheFailingSeed/"+seed+" ")
	assert.Contains(t, replay, "fetched twice")
	assert.Equal(t, 1, strings.Count(replay, "=== RUN   TestExploreReportsAndReplaysTheFailingSeed/seed="), "the replay ran other seeds:\n%s", replay)
}
