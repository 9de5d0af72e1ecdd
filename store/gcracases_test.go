package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/gcratest"
	"github.com/sluice-go/sluice/store"
)

// TestMemoryGCRACases runs the shared GCRA table against the memory store,
// on a clock the test sets (WithClock).
func TestMemoryGCRACases(t *testing.T) {
	for _, c := range gcratest.Cases {
		t.Run(c.Name, func(t *testing.T) {
			p := store.Policy{Name: "case", Rate: float64(c.Limit) / c.Window.Seconds(), Burst: c.Burst}
			require.NoError(t, p.Validate())
			require.Equal(t, c.Interval, p.Interval(), "the store's T for %d per %v", c.Limit, c.Window)
			const t0 = time.Hour // any start: an empty history is full at every time
			var now time.Duration
			m := store.NewMemory(store.WithClock(func() time.Duration { return now }))
			defer func() { require.NoError(t, m.Close()) }()
			for i, st := range c.Steps {
				now = t0 + st.At
				r, err := m.Allow(context.Background(), "k", st.Cost, p)
				if st.Never {
					require.ErrorIs(t, err, store.ErrCostExceedsBurst, "step %d", i)
					continue
				}
				require.NoError(t, err, "step %d", i)
				assert.Equal(t, st.Allowed, r.Allowed, "step %d allowed", i)
				assert.InDelta(t, st.Remaining, r.Remaining, 1e-12, "step %d remaining", i)
				assert.Equal(t, st.RetryAfter, r.RetryAfter, "step %d retry-after", i)
				assert.Equal(t, st.ResetAfter, r.ResetAfter, "step %d reset-after", i)
			}
		})
	}
}
