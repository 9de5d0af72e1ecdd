package redisstore_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/cmd/sluice/redisstore"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func open(t *testing.T, url string) *redisstore.Store {
	s, err := redisstore.Open(url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// openCluster opens a store on the test cluster srv, closed when t ends.
func openCluster(t *testing.T, srv *redistest.Server) *redisstore.Store {
	s, err := redisstore.OpenCluster("rediscluster://" + srv.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestRedisConformance(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, srv.URL())
	storetest.Run(t, func(t *testing.T) store.Store { return s })
}

func TestRedisKeyLayoutAndTTL(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, srv.URL())
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer raw.Close()
	ctx := context.Background()
	p := store.Policy{Rate: 10, Burst: 10} // full again 100 ms per token spent

	r, err := s.Allow(ctx, "ten{ant}", 4, p)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	assert.InDelta(t, 6, r.Remaining, 0.01)

	k := redisstore.Key("ten{ant}")
	assert.Equal(t, "sluice:{ten{ant}}", k)
	ttl, err := raw.PTTL(ctx, k).Result()
	require.NoError(t, err)
	assert.InDelta(t, 400, ttl.Milliseconds(), 20, "TTL is the time until full")
	val, err := raw.Get(ctx, k).Result()
	require.NoError(t, err)
	sec, ns, ok := strings.Cut(val, " ")
	require.True(t, ok, "value %q", val)
	secI, err := strconv.ParseInt(sec, 10, 64)
	require.NoError(t, err)
	nsI, err := strconv.ParseInt(ns, 10, 64)
	require.NoError(t, err)
	assert.Less(t, nsI, int64(1e9))
	tat := time.Unix(secI, nsI)
	assert.WithinDuration(t, time.Now().Add(400*time.Millisecond), tat, 2*time.Second, "TAT is on Redis's (here: our) wall clock")

	// A denial writes nothing.
	before, _ := raw.Get(ctx, k).Result()
	r, err = s.Allow(ctx, "ten{ant}", 7, p)
	require.NoError(t, err)
	require.False(t, r.Allowed)
	after, _ := raw.Get(ctx, k).Result()
	assert.Equal(t, before, after)

	n, err := s.Keys(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)
}

func TestRedisReloadsScriptAfterFlush(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, srv.URL())
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer raw.Close()
	ctx := context.Background()
	p := store.Policy{Rate: 1.0 / 3600, Burst: 3}
	_, err := s.Allow(ctx, "k", 1, p)
	require.NoError(t, err)
	require.NoError(t, raw.ScriptFlush(ctx).Err())
	r, err := s.Allow(ctx, "k", 1, p)
	require.NoError(t, err, "NOSCRIPT must fall back to EVAL")
	assert.True(t, r.Allowed)
	assert.InDelta(t, 1, r.Remaining, 0.01, "charged exactly once across the NOSCRIPT retry")
}

// A refused connection fails at once (one dial, no dial retries), and a
// Redis that comes back is used from the first Ping on, even after more
// failed dials than the pool has connections (go-redis's pool then stops
// dialing and redials only once a second by itself).
func TestRedisDownThenBack(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, srv.URL())
	ctx := context.Background()
	p := store.Policy{Rate: 100, Burst: 10}
	_, err := s.Allow(ctx, "k", 1, p)
	require.NoError(t, err)
	srv.Kill()
	for i := range 50 { // well past the pool size (10 per CPU)
		start := time.Now()
		_, err = s.Allow(ctx, "k", 1, p)
		require.Error(t, err)
		if i > 0 { // the first may find a pooled connection the kill broke
			require.Less(t, time.Since(start), 50*time.Millisecond, "call %d: a refused dial is not retried", i)
		}
		require.Error(t, s.Ping(ctx))
	}
	srv.Restart()
	require.NoError(t, s.Ping(ctx), "the first Ping after Redis is back gets through")
	r, err := s.Allow(ctx, "k", 1, p)
	require.NoError(t, err)
	assert.True(t, r.Allowed)
}

// The first call after a Redis that was killed is back (and a Ping saw it)
// is answered: the service's breaker closes on that Ping and counts the
// next decision. Several rounds, each with one call failing on the broken
// connection in between: a client that keeps the broken connection's error
// for a call or two after fails some round.
func TestRedisFirstCallAfterRestart(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, srv.URL())
	ctx := context.Background()
	p := store.Policy{Rate: 100, Burst: 10}
	for round := range 5 {
		_, err := s.Allow(ctx, "k", 1, p)
		require.NoError(t, err, "round %d", round)
		srv.Kill()
		_, err = s.Allow(ctx, "k", 1, p)
		require.Error(t, err, "round %d", round)
		srv.Restart()
		require.NoError(t, s.Ping(ctx), "round %d", round)
		_, err = s.Allow(ctx, "k", 1, p)
		require.NoError(t, err, "round %d: the first call after the Ping", round)
	}
}

// WithTimeout governs go-redis's own read timeout: a reply held back fails
// after that timeout, not after go-redis's or Open's default.
func TestRedisWithTimeout(t *testing.T) {
	srv := redistest.Start(t)
	proxy := newStallProxy(t, srv.Addr())
	s, err := redisstore.Open("redis://"+proxy.ln.Addr().String()+"/0", redisstore.WithTimeout(600*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	p := store.Policy{Rate: 100, Burst: 10}
	_, err = s.Allow(ctx, "k", 1, p)
	require.NoError(t, err)
	proxy.setStalled(true)
	start := time.Now()
	_, err = s.Allow(ctx, "k", 1, p)
	took := time.Since(start)
	proxy.setStalled(false)
	require.Error(t, err)
	assert.GreaterOrEqual(t, took, 600*time.Millisecond, "not the 250 ms default")
	assert.Less(t, took, 3*time.Second)
}

func BenchmarkRedisAllow(b *testing.B) {
	srv := redistest.Start(b)
	s, err := redisstore.Open(srv.URL())
	require.NoError(b, err)
	defer s.Close()
	p := store.Policy{Rate: 1e6, Burst: 1000}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			_, _ = s.Allow(context.Background(), "bench-"+strconv.Itoa(i&255), 1, p)
			i++
		}
	})
}

func TestRedisClusterConformance(t *testing.T) {
	s := openCluster(t, redistest.StartCluster(t))
	storetest.Run(t, func(t *testing.T) store.Store { return s })
}

func TestOpenRejectsBadURLs(t *testing.T) {
	_, err := redisstore.Open("http://x")
	assert.Error(t, err)
	_, err = redisstore.OpenCluster("redis://x:1")
	assert.ErrorContains(t, err, "rediscluster://")
}
