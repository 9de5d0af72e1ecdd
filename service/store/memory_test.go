package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/service/store"
	"github.com/sluice-go/sluice/service/store/storetest"
)

func TestMemoryConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		m := store.NewMemory(store.WithSweep(time.Hour))
		t.Cleanup(func() { require.NoError(t, m.Close()) })
		return m
	})
}

// vclock is a hand-driven clock for the memory store.
type vclock struct {
	mu  sync.Mutex
	now time.Duration
}

func (c *vclock) Now() time.Duration      { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *vclock) Advance(d time.Duration) { c.mu.Lock(); c.now += d; c.mu.Unlock() }

func TestMemoryVirtualTime(t *testing.T) {
	ctx := context.Background()
	c := &vclock{now: time.Hour}
	m := store.NewMemory(store.WithClock(c.Now))
	defer m.Close()
	p := store.Policy{Rate: 10, Burst: 10}
	for i := range 10 {
		r, err := m.Allow(ctx, "k", 1, p)
		require.NoError(t, err)
		require.True(t, r.Allowed, "burst request %d", i)
	}
	r, _ := m.Allow(ctx, "k", 1, p)
	require.False(t, r.Allowed)
	assert.Equal(t, 100*time.Millisecond, r.RetryAfter)
	c.Advance(30 * time.Millisecond)
	r, _ = m.Allow(ctx, "k", 1, p)
	require.False(t, r.Allowed)
	assert.Equal(t, 70*time.Millisecond, r.RetryAfter)
	assert.InDelta(t, 0.3, r.Remaining, 1e-9)
	c.Advance(70 * time.Millisecond)
	r, _ = m.Allow(ctx, "k", 1, p)
	assert.True(t, r.Allowed)

	// An hour of saturating demand in 1 ms steps: exactly burst + rate·T.
	allowed := 0
	m2 := store.NewMemory(store.WithClock(c.Now))
	defer m2.Close()
	for range 3_600_000 / 10 { // 10 ms steps keep the test fast
		for {
			r, err := m2.Allow(ctx, "h", 1, p)
			require.NoError(t, err)
			if !r.Allowed {
				break
			}
			allowed++
		}
		c.Advance(10 * time.Millisecond)
	}
	assert.Equal(t, 10+10*3600-1, allowed, "burst + rate·T over an hour (the last interval not yet due)")
}

func TestMemorySweepKeepsDecisions(t *testing.T) {
	ctx := context.Background()
	c := &vclock{}
	m := store.NewMemory(store.WithClock(c.Now))
	defer m.Close()
	p := store.Policy{Rate: 1, Burst: 2}
	for i := range 100 {
		_, err := m.Allow(ctx, fmt.Sprint("idle-", i), 1, p)
		require.NoError(t, err)
	}
	_, _ = m.Allow(ctx, "busy", 2, p)
	n, _ := m.Keys(ctx)
	require.Equal(t, int64(101), n)
	assert.Zero(t, m.Sweep(), "nobody is full yet")
	c.Advance(time.Second)
	assert.Equal(t, 100, m.Sweep(), "the idle keys are full after 1 s; busy needs 2 s")
	r, _ := m.Allow(ctx, "busy", 2, p)
	assert.False(t, r.Allowed, "the sweep must keep a drained key's debt")
	c.Advance(time.Second)
	assert.Equal(t, 1, m.Sweep())
	n, _ = m.Keys(ctx)
	assert.Zero(t, n)
}

func TestMemoryClosed(t *testing.T) {
	m := store.NewMemory(store.WithSweep(time.Millisecond))
	require.NoError(t, m.Close())
	require.NoError(t, m.Close())
	_, err := m.Allow(context.Background(), "k", 1, store.Policy{Rate: 1, Burst: 1})
	require.ErrorIs(t, err, store.ErrClosed)
	require.ErrorIs(t, m.Ping(context.Background()), store.ErrClosed)
}

func BenchmarkMemoryAllow(b *testing.B) {
	m := store.NewMemory()
	defer m.Close()
	p := store.Policy{Rate: 1e6, Burst: 1000}
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprint("key-", i)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			_, _ = m.Allow(context.Background(), keys[i&1023], 1, p)
			i++
		}
	})
}
