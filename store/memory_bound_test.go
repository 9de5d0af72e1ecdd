package store_test

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/store"
)

// keys returns what m.Keys reports.
func keys(t *testing.T, m *store.Memory) int64 {
	t.Helper()
	n, err := m.Keys(context.Background())
	require.NoError(t, err)
	return n
}

// TestMemorySweepsByDefault: a store made with no option, as the README's
// middleware makes it, forgets the keys whose buckets are full again. Many
// distinct clients (one request each) leave ~0 keys once their buckets
// have been full for a sweep interval and one more interval of traffic has
// passed, with no goroutine and no call to Sweep.
func TestMemorySweepsByDefault(t *testing.T) {
	ctx := context.Background()
	c := &vclock{}
	m := store.NewMemory(store.WithClock(c.Now))
	defer m.Close()
	p := store.Policy{Rate: 10, Burst: 20}
	const clients = 20_000
	for i := range clients {
		r, err := m.Allow(ctx, fmt.Sprintf("2001:db8:%x::/64", i), 1, p)
		require.NoError(t, err)
		require.True(t, r.Allowed)
	}
	require.Equal(t, int64(clients), keys(t, m), "none is full yet")
	// Two minutes and a bit of one steady client, a request every 10 ms.
	for range int((2*store.DefaultSweep + 4*time.Second) / (10 * time.Millisecond)) {
		c.Advance(10 * time.Millisecond)
		_, err := m.Allow(ctx, "steady", 1, p)
		require.NoError(t, err)
	}
	assert.LessOrEqual(t, keys(t, m), int64(2), "the full buckets are gone")
}

// TestMemorySweepInBubble: in a testing/synctest bubble the default store
// sweeps on the bubble's fake time and leaves nothing running: the bubble
// ends (a goroutine left waiting would make synctest.Test fail).
func TestMemorySweepInBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := store.NewMemory()
		p := store.Policy{Rate: 100, Burst: 5}
		for i := range 10_000 {
			_, err := m.Allow(t.Context(), fmt.Sprint("k", i), 1, p)
			require.NoError(t, err)
		}
		for range int((2*store.DefaultSweep + 4*time.Second) / (100 * time.Millisecond)) {
			time.Sleep(100 * time.Millisecond)
			_, err := m.Allow(t.Context(), "steady", 1, p)
			require.NoError(t, err)
		}
		assert.LessOrEqual(t, keys(t, m), int64(1))
		// Not closed on purpose: the README's store never is.
	})
}

// TestMemoryMaxKeys: past its cap a shard forgets the keys nearest to full
// (they start again full: more than their share, never less) and counts
// them; the store never holds more than the cap.
func TestMemoryMaxKeys(t *testing.T) {
	ctx := context.Background()
	c := &vclock{}
	const maxKeys = 256 * 20
	m := store.NewMemory(store.WithClock(c.Now), store.WithMaxKeys(maxKeys))
	defer m.Close()
	p := store.Policy{Rate: 1.0 / 3600, Burst: 1} // a key stays drained for an hour
	const n = 20_000
	for i := range n {
		c.Advance(time.Millisecond) // later keys are further from full
		r, err := m.Allow(ctx, fmt.Sprint("k", i), 1, p)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		if i%997 == 0 {
			require.LessOrEqual(t, keys(t, m), int64(maxKeys))
		}
	}
	held := keys(t, m)
	assert.LessOrEqual(t, held, int64(maxKeys))
	assert.Greater(t, held, int64(maxKeys/2))
	assert.Equal(t, int64(n)-held, m.Evicted(), "every key forgotten is counted")
	r, err := m.Allow(ctx, fmt.Sprint("k", n-1), 1, p)
	require.NoError(t, err)
	assert.False(t, r.Allowed, "the newest key, furthest from full, is kept")
	r, err = m.Allow(ctx, "k0", 1, p)
	require.NoError(t, err)
	assert.True(t, r.Allowed, "the oldest, nearest to full, was forgotten: it starts full")
}
