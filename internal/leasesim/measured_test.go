package leasesim_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/leasesim"
)

// Doorman's scenario with demands the replicas measure themselves (what
// they admitted, and whether callers waited) rather than declare: the
// bound holds and the shares use the capacity as well; what is admitted
// trails by a point or two, as a measure trails the demand it measures.
func TestDoormanMeasured(t *testing.T) {
	t.Parallel()
	cfg := leasesim.Doorman(1)
	cfg.Measured = true
	cfg.Length = length(30*time.Minute, 3*time.Minute)
	r, err := leasesim.Run(cfg)
	require.NoError(t, err)
	logResult(t, r)
	assert.LessOrEqual(t, r.Excess, 0.0)
	assert.GreaterOrEqual(t, r.Utilization, 0.98)
	assert.GreaterOrEqual(t, r.Used, 0.95)
}
