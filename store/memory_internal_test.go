package store

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

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
	h := func(k string) uint64 { _, sh := keyOf(m, k); return sh }
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
	kb, _ := keyOf(m, busy)
	slot := s.tab.Load().find(kb, "")
	require.NotNil(t, slot)
	read := slot.tat.Load() // the racing caller's read

	require.Equal(t, 1, m.Sweep())
	require.False(t, slot.tat.CompareAndSwap(read, read+int64(time.Second)), "the old slot must be frozen")
	moved := s.tab.Load().find(kb, "")
	require.NotNil(t, moved)
	require.NotSame(t, slot, moved)
	require.Equal(t, read, moved.tat.Load())
	ki, _ := keyOf(m, idle)
	require.Nil(t, s.tab.Load().find(ki, ""))

	// The caller that saw frozen retries under the lock, in the new table.
	r, err := m.Allow(ctx, busy, 1, p)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	r, err = m.Allow(ctx, busy, 1, p)
	require.NoError(t, err)
	require.False(t, r.Allowed, "busy had refilled one token only")
}

// keyOf is the memKey of a short key in m and the index of its shard, as
// Allow finds them.
func keyOf(m *Memory, key string) (memKey, uint64) {
	h, a, b := m.hk.StringWords(key)
	k, _ := makeKey(key, h, a, b)
	return k, h & (memoryShards - 1)
}

// TestMemTableComparesKeys: a slot whose tag matches is the key's only if
// the words match too (short keys) or the stored key does (long keys), so
// two keys whose tags collide keep separate buckets.
func TestMemTableComparesKeys(t *testing.T) {
	short := memKey{tag: 1<<63 | 5<<58 | 42<<8, w0: 1, w1: 2}
	long, longKey := memKey{tag: 1<<63 | 17<<58 | 42<<8}, strings.Repeat("a", 20)
	tb := newMemTable(4, true)
	tb.insert(short, "", 10)
	tb.insert(long, longKey, 20)

	got := tb.find(short, "")
	require.NotNil(t, got)
	require.Equal(t, int64(10), got.tat.Load())
	got = tb.find(long, longKey)
	require.NotNil(t, got)
	require.Equal(t, int64(20), got.tat.Load())

	other := short
	other.w1 = 3
	require.Nil(t, tb.find(other, ""), "same tag, other words")
	require.Nil(t, tb.find(long, strings.Repeat("a", 19)+"b"), "same tag, other long key")

	g := tb.grow()
	require.Equal(t, int64(20), g.find(long, longKey).tat.Load(), "grow keeps long keys")
	require.Equal(t, int64(10), g.find(short, "").tat.Load())
}

// TestMemoryKeyLengths gives every length from 0 to 40 bytes two keys that
// differ in one byte (the first, then the last), in an order that turns
// shards from short-only to long-holding midway: each key must keep a
// bucket of its own through the table replacements that brings.
func TestMemoryKeyLengths(t *testing.T) {
	ctx := context.Background()
	var now time.Duration
	m := NewMemory(WithClock(func() time.Duration { return now }))
	defer m.Close()
	p := Policy{Rate: 1, Burst: 2}
	var keys []string
	for n := range 41 {
		k := strings.Repeat("k", n)
		keys = append(keys, k)
		if n > 0 {
			keys = append(keys, "x"+k[1:], k[:n-1]+"y")
		}
	}
	for round, want := range []bool{true, true, false} {
		for _, k := range keys {
			r, err := m.Allow(ctx, k, 1, p)
			require.NoError(t, err)
			require.Equal(t, want, r.Allowed, "round %d, key %q", round, k)
		}
	}
	n, err := m.Keys(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(len(keys)), n)
	now = time.Second // one token back for every key
	for _, k := range keys {
		r, err := m.Allow(ctx, k, 1, p)
		require.NoError(t, err)
		require.True(t, r.Allowed, "key %q", k)
	}
}

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

// TestMemKeyFitsInRegisters: a memKey travels from makeKey through find in
// registers only while it has at most four scalar fields and 32 bytes (see
// memKey). A field more costs every decision a copy through the stack, so
// this fails first.
func TestMemKeyFitsInRegisters(t *testing.T) {
	require.LessOrEqual(t, unsafe.Sizeof(memKey{}), uintptr(32))
	require.LessOrEqual(t, reflect.TypeFor[memKey]().NumField(), 4)
}
