package store

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSweepFreezesTheTableItReplaces plays a lock-free caller that read a
// key's TAT just before a sweep replaced the key's table: its CAS on the old
// slot must fail (else its spend would land in a table nobody reads any
// more and the key would be allowed again), and the new table must hold the
// TAT it read.
func TestSweepFreezesTheTableItReplaces(t *testing.T) {
	ctx := context.Background()
	var now time.Duration
	m := NewMemory(WithClock(func() time.Duration { return now }))
	defer m.Close()
	p := Policy{Rate: 1, Burst: 5}
	// Two keys in one shard: "idle" goes full and is swept, "busy" is kept.
	busy, idle := "busy", ""
	h := func(k string) uint64 { return maphashString(m, k) & (memoryShards - 1) }
	for i := 0; idle == ""; i++ {
		if k := fmt.Sprint("idle-", i); h(k) == h(busy) {
			idle = k
		}
	}
	_, err := m.Allow(ctx, idle, 1, p)
	require.NoError(t, err)
	_, err = m.Allow(ctx, busy, 5, p)
	require.NoError(t, err)
	now = time.Second // idle is full again, busy has 1 of 5

	s := &m.shards[h(busy)]
	tag := maphashString(m, busy) | 1<<63
	slot := s.tab.Load().find(tag, busy)
	require.NotNil(t, slot)
	read := slot.tat.Load() // the racing caller's read

	require.Equal(t, 1, m.Sweep())
	require.False(t, slot.tat.CompareAndSwap(read, read+int64(time.Second)), "the old slot must be frozen")
	moved := s.tab.Load().find(tag, busy)
	require.NotNil(t, moved)
	require.NotSame(t, slot, moved)
	require.Equal(t, read, moved.tat.Load())
	require.Nil(t, s.tab.Load().find(maphashString(m, idle)|1<<63, idle))

	// The caller that saw frozen retries under the lock, in the new table.
	r, err := m.Allow(ctx, busy, 1, p)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	r, err = m.Allow(ctx, busy, 1, p)
	require.NoError(t, err)
	require.False(t, r.Allowed, "busy had refilled one token only")
}

func maphashString(m *Memory, k string) uint64 { return maphash.String(m.seed, k) }

// TestIntervalCacheUnderChurn has goroutines ask for more rates than the
// cache has ways, so entries are overwritten while others read them: every
// answer must still be the rate's own interval (a torn read of one rate's
// bits with another's T would fail it).
func TestIntervalCacheUnderChurn(t *testing.T) {
	var c intervalCache
	rates := make([]float64, 4*intervalWays)
	for i := range rates {
		rates[i] = float64(i+1) * 7.3
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20_000 {
				r := rates[(i*(g+1))%len(rates)]
				if got, want := c.of(r), int64(Policy{Rate: r}.Interval()); got != want {
					t.Errorf("rate %v: interval %d, want %d", r, got, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	require.Equal(t, int64(Policy{Rate: 7.3}.Interval()), c.of(7.3))
}
