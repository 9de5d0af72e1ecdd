package leasesim_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/leasesim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestProbe(t *testing.T) {
	for _, cfg := range []leasesim.Config{leasesim.Doorman(1)} {
		start := time.Now()
		r, err := leasesim.Run(cfg)
		require.NoError(t, err)
		t.Logf("%d: %v: admits %d rpcs %d (%.3f/s) fail %d deaths %d outages %d restarts %d spikes %d excess %.3f util %.4f used %.4f handed %.4f peak %.4f n=%d",
			cfg.Replicas, time.Since(start), len(r.Admits), r.RPCs, float64(r.RPCs)/cfg.Length.Seconds(), r.Failures, r.Deaths, r.Outages, r.Restarts, r.Spikes, r.Excess, r.Utilization, r.Used, r.Handed, r.PeakShares, r.Counted)
	}
}
