package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/storetest"
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

// TestMemoryMatchesMapStore plays the same random calls, clock steps and
// sweeps against the store (with its own sweeping turned off) and against
// mapMemory (the plain map it replaced): every result, sweep count and key
// count must be the same. A store that sweeps (full buckets dropped as
// tables grow, as calls pass the sweep's pace, and by WithSweep's goroutine
// on real time, at a fast pace here) must give every same result too: a
// full bucket dropped is a fresh one.
func TestMemoryMatchesMapStore(t *testing.T) {
	ctx := context.Background()
	c := &vclock{}
	m := store.NewMemory(store.WithClock(c.Now), store.WithSweep(0))
	defer m.Close()
	swept := store.NewMemory(store.WithClock(c.Now), store.WithSweep(time.Second))
	defer swept.Close()
	ref := newMapMemory(c.Now)
	policies := []store.Policy{{Rate: 100, Burst: 4}, {Rate: 3, Burst: 10}}
	keys := make([]string, 3000) // enough that every shard's table grows
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 60_000 {
		switch op := rng.IntN(1000); {
		case op < 2:
			require.Equal(t, ref.Sweep(), m.Sweep(), "sweep at call %d", i)
		case op < 100:
			c.Advance(time.Duration(rng.IntN(20_000_000)))
		default:
			k := keys[rng.IntN(len(keys))]
			p := policies[len(k)%2]
			cost := 1 + rng.Int64N(p.Burst)
			want, err1 := ref.Allow(k, cost, p)
			got, err2 := m.Allow(ctx, k, cost, p)
			if err1 != nil || err2 != nil || got != want { // not require: 60k calls of t.Helper are slow under -race
				t.Fatalf("call %d: key %s cost %d: got %+v, %v; the map store %+v, %v", i, k, cost, got, err2, want, err1)
			}
			if got, err := swept.Allow(ctx, k, cost, p); err != nil || got != want {
				t.Fatalf("call %d: key %s cost %d: sweeping store got %+v, %v; the map store %+v", i, k, cost, got, err, want)
			}
		}
	}
	n, err := m.Keys(ctx)
	require.NoError(t, err)
	require.Equal(t, ref.Keys(), n)
	require.Positive(t, n)
	c.Advance(time.Hour)
	require.Equal(t, int(n), m.Sweep(), "after an hour every bucket is full")
	n, _ = m.Keys(ctx)
	require.Zero(t, n)
}

// TestMemoryRacingSweepsStayExact has goroutines spend on shared keys while
// the clock moves and sweeps and table growth replace tables under them: no
// key may be allowed more than burst + elapsed/T, the GCRA bound, however
// the calls interleave with a table being replaced.
func TestMemoryRacingSweepsStayExact(t *testing.T) {
	ctx := context.Background()
	var clock atomic.Int64 // nanoseconds; the workers move it
	m := store.NewMemory(store.WithClock(func() time.Duration { return time.Duration(clock.Load()) }))
	defer m.Close()
	p := store.Policy{Rate: 1000, Burst: 3} // T = 1 ms
	const hot, cold, workers, calls = 64, 1000, 4, 20_000
	keys := make([]string, hot+cold)
	for i := range keys {
		keys[i] = fmt.Sprint("key-", i)
	}
	allowed := make([]atomic.Int64, len(keys))
	var swept atomic.Int64
	done := make(chan struct{})
	var sweeper sync.WaitGroup
	sweeper.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
				swept.Add(int64(m.Sweep()))
			}
		}
	})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := range calls {
				if i%50 == 0 {
					clock.Add(int64(10 * time.Microsecond))
				}
				k := rng.IntN(hot) // mostly hot keys, saturated
				if rng.IntN(8) == 0 {
					k = hot + rng.IntN(cold) // cold keys go full and get swept
				}
				r, err := m.Allow(ctx, keys[k], 1, p)
				if !assert.NoError(t, err) {
					return
				}
				if r.Allowed {
					allowed[k].Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(done)
	sweeper.Wait()
	elapsed := time.Duration(clock.Load())
	bound := p.Burst + int64(elapsed/p.Interval())
	for i := range allowed {
		require.LessOrEqual(t, allowed[i].Load(), bound, "key %s over %v", keys[i], elapsed)
	}
	for i := range hot { // saturated: near the bound (the last millisecond may see no call)
		assert.GreaterOrEqual(t, allowed[i].Load(), bound-2, "hot key %s", keys[i])
	}
	assert.Positive(t, swept.Load(), "sweeps dropped keys while calls raced them")
}

func TestMemoryAllowDoesNotAllocate(t *testing.T) {
	ctx := context.Background()
	m := store.NewMemory()
	defer m.Close()
	p := store.Policy{Rate: 1e9, Burst: 1e9}
	_, _ = m.Allow(ctx, "known", 1, p)
	assert.Zero(t, testing.AllocsPerRun(1000, func() { _, _ = m.Allow(ctx, "known", 1, p) }), "allowed")
	q := store.Policy{Rate: 1.0 / 3600, Burst: 1}
	_, _ = m.Allow(ctx, "drained", 1, q)
	assert.Zero(t, testing.AllocsPerRun(1000, func() { _, _ = m.Allow(ctx, "drained", 1, q) }), "denied")
}

// TestMemorySynctest: a store made in a testing/synctest bubble decides on
// the bubble's fake time, to the nanosecond, with no option; one made
// outside reads real time.
func TestMemorySynctest(t *testing.T) {
	p := store.Policy{Name: "p", Rate: 10, Burst: 2} // T = 100 ms
	synctest.Test(t, func(t *testing.T) {
		m := store.NewMemory()
		defer m.Close()
		for range 2 {
			r, err := m.Allow(t.Context(), "k", 1, p)
			require.NoError(t, err)
			require.True(t, r.Allowed)
		}
		r, _ := m.Allow(t.Context(), "k", 1, p)
		require.False(t, r.Allowed)
		require.Equal(t, 100*time.Millisecond, r.RetryAfter)
		time.Sleep(100*time.Millisecond - 1)
		r, _ = m.Allow(t.Context(), "k", 1, p)
		require.False(t, r.Allowed, "one ns before the token")
		require.Equal(t, time.Duration(1), r.RetryAfter)
		time.Sleep(time.Nanosecond) // the bubble's clock moves by exactly this
		r, _ = m.Allow(t.Context(), "k", 1, p)
		require.True(t, r.Allowed, "at the token's instant")
	})

	slow := store.Policy{Name: "slow", Rate: 0.001, Burst: 1} // T = 1000 s
	m := store.NewMemory()
	defer m.Close()
	r, err := m.Allow(context.Background(), "k", 1, slow)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	r, _ = m.Allow(context.Background(), "k", 1, slow)
	require.False(t, r.Allowed, "real time does not jump")
	assert.InDelta(t, float64(1000*time.Second), float64(r.RetryAfter), float64(time.Second))
}
