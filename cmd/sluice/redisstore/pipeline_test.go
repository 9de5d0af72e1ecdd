package redisstore_test

import (
	"context"
	"runtime/metrics"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/redisstore"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/store"
)

// tripCounter counts the round trips a go-redis client makes (one per
// command sent alone, one per pipeline of any length) and the commands.
type tripCounter struct {
	trips, cmds atomic.Int64
	alone       *atomic.Int64 // if set, counts the commands sent alone
}

func (h *tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.trips.Add(1)
		h.cmds.Add(1)
		if h.alone != nil {
			h.alone.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.trips.Add(1)
		h.cmds.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// Decisions in flight at once share round trips: 64 goroutines × 50
// calls take far fewer round trips than calls, and every answer is still
// each call's own (each goroutine's key ends exactly 50 tokens down).
func TestRedisConcurrentCallsSharePipelines(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Protocol: 2, MaxRetries: -1, DialerRetries: 1})
	h := &tripCounter{}
	c.AddHook(h)
	s := redisstore.New(c)
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	p := store.Policy{Rate: 1.0 / 3600, Burst: 100} // no refill within the test
	_, err := s.Allow(ctx, "warm", 1, p)            // loads the script
	require.NoError(t, err)
	h.trips.Store(0)
	h.cmds.Store(0)

	const goroutines, each = 64, 50
	var wg sync.WaitGroup
	start := make(chan struct{})
	last := make([]store.Result, goroutines)
	errs := make([]error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			<-start
			key := "g" + strconv.Itoa(g)
			for range each {
				r, err := s.Allow(ctx, key, 1, p)
				if err != nil {
					errs[g] = err
					return
				}
				last[g] = r
			}
		})
	}
	close(start)
	wg.Wait()
	for g := range goroutines {
		require.NoError(t, errs[g])
		assert.True(t, last[g].Allowed)
		assert.InDelta(t, 100-each, last[g].Remaining, 0.01, "goroutine %d: each call charged once", g)
	}
	calls, trips := int64(goroutines*each), h.trips.Load()
	t.Logf("%d calls in %d round trips of %d script calls", calls, trips, h.cmds.Load())
	assert.LessOrEqual(t, trips*4, calls, "calls in flight at once go out together")
}

// A caller's deadline bounds its wait whether its call goes out alone (the
// client's read deadline) or shares another's round trip (it stops waiting),
// without cutting the shared round trip short; and a context already ended
// sends nothing.
func TestRedisCallerContextEndsAlone(t *testing.T) {
	srv := redistest.Start(t)
	proxy := newStallProxy(t, srv.Addr())
	s, err := redisstore.Open("redis://"+proxy.ln.Addr().String()+"/0", redisstore.WithTimeout(5*time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer raw.Close()
	p := store.Policy{Rate: 1.0 / 3600, Burst: 10}
	_, err = s.Allow(context.Background(), "k", 1, p)
	require.NoError(t, err)

	done, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = s.Allow(done, "never", 1, p)
	require.ErrorIs(t, err, context.Canceled)
	n, err := raw.Exists(context.Background(), redisstore.Key("never")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "an ended context sent nothing")

	proxy.setStalled(true)
	other := make(chan error, 1)
	go func() {
		_, err := s.Allow(context.Background(), "k", 1, p)
		other <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = s.Allow(ctx, "k", 1, p)
	took := time.Since(start)
	require.Error(t, err)
	assert.Less(t, took, 2*time.Second, "bounded by the caller's deadline, not the 5 s read timeout")
	proxy.setStalled(false)
	require.NoError(t, <-other, "the other call's round trip was not cut short")
}

// The timeout bounds each call from its start, also one that waits on a
// shared round trip, with no deadline in its context (decide.Gate gives
// none to a store that bounds itself): with Redis's replies held back, a
// call queued behind a stalled round trip returns a timeout error within
// the bound, not after that round trip's read timeout and then its own.
// Once Redis answers again, calls are answered (no call state is left
// behind by the expired ones).
func TestRedisTimeoutBoundsQueuedCalls(t *testing.T) {
	const bound = 300 * time.Millisecond
	srv := redistest.Start(t)
	proxy := newStallProxy(t, srv.Addr())
	s, err := redisstore.Open("redis://"+proxy.ln.Addr().String()+"/0", redisstore.WithTimeout(bound))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	p := store.Policy{Rate: 1.0 / 3600, Burst: 100}
	_, err = s.Allow(ctx, "k", 1, p) // loads the script, warms the connection
	require.NoError(t, err)

	proxy.setStalled(true)
	first := make(chan error, 1)
	go func() {
		_, err := s.Allow(ctx, "k", 1, p)
		first <- err
	}()
	<-proxy.held // the first call is in flight, its reply held back
	const queued = 4
	took := make(chan time.Duration, queued)
	errs := make(chan error, queued)
	for range queued {
		go func() {
			start := time.Now()
			_, err := s.Allow(ctx, "k", 1, p)
			took <- time.Since(start)
			errs <- err
		}()
	}
	for range queued {
		d, err := <-took, <-errs
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.GreaterOrEqual(t, d, bound)
		// Without the bound: the first call's read timeout (up to one
		// bound), then the queued calls' own round trip (one more).
		assert.Less(t, d, bound+bound/2, "within the bound, not after two round trips' timeouts")
	}
	require.Error(t, <-first, "the stalled round trip times out")
	proxy.setStalled(false)
	for i := range 3 {
		_, err := s.Allow(ctx, "k", 1, p)
		require.NoError(t, err, i)
	}
}

// Under steady concurrency calls share round trips and few go out alone:
// 16 goroutines calling without pause over 1000 keys (BenchmarkRedis's 16g
// row) make at least 8 calls per round trip, at most one call in 50
// alone, and start at most one flusher goroutine per 50 calls.
func TestRedisConcurrentCallsRarelyGoAlone(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Protocol: 2, MaxRetries: -1, DialerRetries: 1})
	h := &tripCounter{}
	c.AddHook(h)
	s := redisstore.New(c)
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	p := store.Policy{Rate: 1000, Burst: 1000}
	_, err := s.Allow(ctx, "warm", 1, p) // loads the script
	require.NoError(t, err)
	h.trips.Store(0)
	h.cmds.Store(0)
	var alone atomic.Int64
	h.alone = &alone

	const goroutines, each = 16, 500
	var wg sync.WaitGroup
	var failed atomic.Int64
	created0 := goroutinesCreated()
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				key := "k" + strconv.Itoa(((g+1)*104729+i)*7919%1000)
				if _, err := s.Allow(ctx, key, 1, p); err != nil {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	created := goroutinesCreated() - created0 - goroutines
	require.Zero(t, failed.Load())
	calls := int64(goroutines * each)
	t.Logf("%d calls in %d round trips, %d alone, %d goroutines started", calls, h.trips.Load(), alone.Load(), created)
	assert.LessOrEqual(t, h.trips.Load()*8, calls, "at least 8 calls per round trip")
	assert.LessOrEqual(t, alone.Load()*50, calls, "at most one call in 50 goes out alone")
	assert.LessOrEqual(t, created*50, calls, "flushers keep going, not one new goroutine per batch")
}

// goroutinesCreated is the process's count of goroutines started so far.
func goroutinesCreated() int64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}
