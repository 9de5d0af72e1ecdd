package adaptsim_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/adaptsim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func scenario(t *testing.T, name string) adaptsim.Scenario {
	for _, sc := range adaptsim.Scenarios() {
		if sc.Name == name {
			return sc
		}
	}
	t.Fatalf("no scenario %q", name)
	return adaptsim.Scenario{}
}

// The targets of docs/adaptive.md, for httplimit.Adaptive over 15 virtual
// minutes, with 1 and 16 callers (under the race detector, 16 callers in
// the drop scenario only).
func TestTargets(t *testing.T) {
	for _, callers := range []int{1, 16} {
		t.Run(fmt.Sprint(callers, " callers"), func(t *testing.T) {
			for _, sc := range adaptsim.Scenarios() {
				if raceEnabled && callers > 1 && sc.Name != "50% drop for 60 s" {
					continue
				}
				t.Run(sc.Name, func(t *testing.T) {
					t.Parallel()
					r, err := adaptsim.Run(sc, adaptsim.Adaptive, callers, 1)
					require.NoError(t, err)
					t.Logf("used %.1f%%, %d 429s (%d in the first minute), 90%% reached after %v, recovery %v",
						100*r.Utilization, r.Refusals, r.FirstMinute, r.Reach90, r.Recovery)
					assert.GreaterOrEqual(t, r.Utilization, 0.93, "quota used outside the minute after each change")
					switch sc.Name {
					case "unknown, start 10× low":
						assert.Positive(t, r.Reach90)
						assert.LessOrEqual(t, r.Reach90, 60*time.Second, "90% of the quota reached")
					case "unknown, start 10× high":
						assert.Less(t, r.FirstMinute, int64(50), "429s before it settles")
					case "50% drop for 60 s":
						assert.LessOrEqual(t, r.Refusals, int64(30), "429s in the run")
						assert.Positive(t, r.Recovery)
						assert.LessOrEqual(t, r.Recovery, 5*time.Second, "back to 90% of the restored quota")
					}
				})
			}
		})
	}
}

// The quota's return is taken up within 5 s wherever it falls in the
// client's cycle of probes: the drop's end is moved across a cycle (about
// 5 s) in steps of 0.5 s (1 s under the race detector).
func TestRecoveryAnyPhase(t *testing.T) {
	step := 500 * time.Millisecond
	if raceEnabled {
		step = time.Second
	}
	for length := 60 * time.Second; length < 66*time.Second; length += step {
		t.Run(fmt.Sprint(length), func(t *testing.T) {
			t.Parallel()
			sc := adaptsim.Drop(60*time.Second, length)
			sc.Length = 60*time.Second + length + 30*time.Second
			r, err := adaptsim.Run(sc, adaptsim.Adaptive, 1, 1)
			require.NoError(t, err)
			t.Logf("drop for %v: recovery %v", length, r.Recovery)
			assert.Positive(t, r.Recovery)
			assert.LessOrEqual(t, r.Recovery, 5*time.Second)
		})
	}
}

// A run is a function of its inputs: the same seed gives the same run,
// slot for slot.
func TestSameSeedSameRun(t *testing.T) {
	sc := scenario(t, "noisy neighbour")
	sc.Length = 3 * time.Minute
	a, err := adaptsim.Run(sc, adaptsim.Adaptive, 16, 7)
	require.NoError(t, err)
	b, err := adaptsim.Run(sc, adaptsim.Adaptive, 16, 7)
	require.NoError(t, err)
	assert.Equal(t, a.Served, b.Served)
	assert.Equal(t, a.Refused, b.Refused)
	assert.Equal(t, a.Rate, b.Rate)
}
