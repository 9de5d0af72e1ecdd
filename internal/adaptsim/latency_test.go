package adaptsim_test

import (
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/adaptsim"
)

// The targets again with 20 ms of latency and 16 callers, in
// testing/synctest bubbles: requests overlap in flight, and those in
// flight when a throttle comes back are refused too. (One caller cannot
// send more than 50 a second at 20 ms, so it is not run here.) Under the
// race detector, the two scenarios where overlap counts most.
func TestTargetsWithLatency(t *testing.T) {
	for _, sc := range adaptsim.Scenarios() {
		if raceEnabled && sc.Name != "50% drop for 60 s" && sc.Name != "unknown, start 10× high" {
			continue
		}
		t.Run(sc.Name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r, err := adaptsim.RunGoroutines(sc, adaptsim.Adaptive, 16, 20*time.Millisecond, 1)
				require.NoError(t, err)
				t.Logf("| %s | adaptive | 16 | %.1f%% | %d | %d | %s | %s |", sc.Name,
					100*r.Utilization, r.Refusals, r.FirstMinute, secs(r.Reach90), secs(r.Recovery))
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
		})
	}
}

func secs(d time.Duration) string {
	if d < 0 {
		return "–"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + " s"
}
