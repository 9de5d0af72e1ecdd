//go:build linux || darwin

package sharedbucket

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/gcratest"
)

// TestGCRACases runs the shared GCRA table against a Table at explicit
// times (DecideAt): the claim of a new key, then the spend path.
func TestGCRACases(t *testing.T) {
	for _, c := range gcratest.Cases {
		t.Run(c.Name, func(t *testing.T) {
			p := Policy{Limit: c.Limit, Window: c.Window, Burst: c.Burst}
			require.NoError(t, p.Validate())
			require.Equal(t, c.Interval, p.Interval(), "the table's T for %d per %v", c.Limit, c.Window)
			tb := openTemp(t, p)
			for i, st := range c.Steps {
				d := tb.DecideAt("k", st.Cost, t0+int64(st.At))
				if st.Never {
					assert.False(t, d.Allowed, "step %d", i)
					assert.Equal(t, Never, d.RetryAfter, "step %d", i)
					continue
				}
				assert.Equal(t, st.Allowed, d.Allowed, "step %d allowed", i)
				assert.InDelta(t, st.Remaining, d.Remaining, 1e-12, "step %d remaining", i)
				assert.Equal(t, st.RetryAfter, d.RetryAfter, "step %d retry-after", i)
				assert.Equal(t, st.ResetAfter, d.ResetAfter, "step %d reset-after", i)
				// The read-only queries agree with the decision.
				assert.InDelta(t, st.Remaining, tb.RemainingAt("k", t0+int64(st.At)), 1e-12, "step %d RemainingAt", i)
				assert.Equal(t, st.ResetAfter, tb.ResetAfterAt("k", t0+int64(st.At)), "step %d ResetAfterAt", i)
				if !st.Allowed {
					assert.Equal(t, st.RetryAfter, tb.RetryAfterAt("k", st.Cost, t0+int64(st.At)), "step %d RetryAfterAt", i)
				}
			}
		})
	}
}
