package gcratest_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/gcratest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestCasesFollowTheDefinition checks the written table against Replay.
func TestCasesFollowTheDefinition(t *testing.T) {
	for _, c := range gcratest.Cases {
		t.Run(c.Name, func(t *testing.T) {
			// T is Window/Limit, rounded up when it is not whole.
			w, l := int64(c.Window), c.Limit
			require.Equal(t, (w+l-1)/l, int64(c.Interval))
			require.Less(t, c.Tau(), int64(1)<<52, "the Lua script is exact only below 2^52 ns")
			for i, o := range gcratest.Replay(c) {
				want := c.Steps[i]
				assert.Equal(t, want.Never, o.Never, "step %d never", i)
				assert.Equal(t, want.Allowed, o.Allowed, "step %d allowed", i)
				assert.InDelta(t, want.Remaining, o.Remaining, 1e-12, "step %d remaining", i)
				assert.Equal(t, want.RetryAfter, o.RetryAfter, "step %d retry-after", i)
				assert.Equal(t, want.ResetAfter, o.ResetAfter, "step %d reset-after", i)
			}
		})
	}
}

// TestCasesCoverTheEdges keeps the table's edge cases in it.
func TestCasesCoverTheEdges(t *testing.T) {
	var costIsBurst, never, boundaryAllowed, boundaryDenied, fractional, idle bool
	for _, c := range gcratest.Cases {
		if int64(c.Window)%c.Limit != 0 {
			fractional = true
		}
		for i, o := range gcratest.Replay(c) {
			st := c.Steps[i]
			costIsBurst = costIsBurst || st.Cost == c.Burst && o.Allowed
			never = never || o.Never
			boundaryAllowed = boundaryAllowed || o.Allowed && o.Excess == 0
			boundaryDenied = boundaryDenied || !o.Allowed && o.Excess == 1
			idle = idle || i > 0 && st.At-c.Steps[i-1].At > 10*time.Duration(c.Tau())
		}
	}
	assert.True(t, costIsBurst, "cost = burst")
	assert.True(t, never, "cost > burst")
	assert.True(t, boundaryAllowed, "allowed exactly at the boundary")
	assert.True(t, boundaryDenied, "denied 1ns before it")
	assert.True(t, fractional, "an interval that is not a whole number of ns")
	assert.True(t, idle, "a long idle gap")
}
