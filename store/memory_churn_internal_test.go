package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMemoryBoundedUnderChurn: clients that rotate keys (a new /64 for
// every request, 10,000 a second) keep the store at about the keys seen
// within the last sweep interval (here 0.25 s of them, 2,500) and one more
// interval at most, not every key ever seen (50,000): a shard that must
// grow first drops its keys full for an interval. (Internal: the interval
// without WithSweep's goroutine, so only the calls sweep.)
func TestMemoryBoundedUnderChurn(t *testing.T) {
	ctx := context.Background()
	now := time.Duration(0)
	m := NewMemory(WithClock(func() time.Duration { return now }), sweepInterval(250*time.Millisecond))
	defer m.Close()
	p := Policy{Rate: 10, Burst: 20} // one request: full again after 0.1 s
	peak := int64(0)
	for i := range 50_000 {
		now += 100 * time.Microsecond
		_, err := m.Allow(ctx, fmt.Sprint("rotating-", i), 1, p)
		require.NoError(t, err)
		if i%1000 == 0 {
			peak = max(peak, func() int64 { n, _ := m.Keys(ctx); return n }())
		}
	}
	t.Logf("peak %d keys for 10,000 a second", peak)
	assert.Less(t, peak, int64(10_000), "5 s of rotating clients")
}
