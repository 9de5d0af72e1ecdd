package ticker

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The boundary after the next, under a period so long that k·period passes
// the largest Duration, still lies a period after the one before it. Before,
// k·period wrapped, the boundary lay 292 years in the past, and Next, told
// it was due, woke at once again and again at one instant.
func TestGridHugePeriodDoesNotWrap(t *testing.T) {
	const period = time.Duration(1) << 62 // 146 years
	start := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	g := &grid{period: period, start: start, last: 1}
	assert.Equal(t, start.Add(period), g.boundary(1))
	assert.Equal(t, start.Add(period).Add(period), g.boundary(2))
	due, ok := g.Due(start.Add(period), 0, 1)
	assert.True(t, ok)
	assert.Equal(t, start.Add(period).Add(period), due, "the next boundary is a period after the last")
	assert.Equal(t, start.Add(period).Add(period).Add(period), g.boundary(3))
}
