package redisstore_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/redisstore"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/store"
)

// AllowEach answers each request as Allow one after another would (a key
// that repeats counts its earlier requests; a denied one spends nothing; a
// bad cost is refused alone), in one script call on one node and in one
// round trip on a Cluster, whose keys here lie in several hash slots.
func TestRedisAllowEachAsAllowInTurn(t *testing.T) {
	for _, cluster := range []bool{false, true} {
		t.Run(map[bool]string{false: "single", true: "cluster"}[cluster], func(t *testing.T) {
			var s *redisstore.Store
			var srv *redistest.Server
			if cluster {
				srv = redistest.StartCluster(t)
				s = openCluster(t, srv)
			} else {
				srv = redistest.Start(t)
				s = open(t, srv.URL())
			}
			raw := redis.NewClient(&redis.Options{Addr: srv.Addr()})
			defer raw.Close()
			ctx := context.Background()
			slow := store.Policy{Rate: 1.0 / 3600, Burst: 5} // no refill within the test
			other := store.Policy{Rate: 1.0 / 3600, Burst: 3}
			_, err := s.Allow(ctx, "warm", 1, slow) // loads the script
			require.NoError(t, err)
			batch := func(prefix string) []store.Request {
				return []store.Request{
					{Key: prefix + "a", Cost: 2, Policy: slow},
					{Key: prefix + "b", Cost: 1, Policy: other},
					{Key: prefix + "a", Cost: 2, Policy: slow},
					{Key: prefix + "c", Cost: 0, Policy: other}, // refused: cost 0
					{Key: prefix + "a", Cost: 1, Policy: slow},
					{Key: prefix + "d", Cost: 4, Policy: other}, // refused: over the burst
				}
			}
			for round := range 4 {
				reqs := batch("each-")
				out, errs := make([]store.Result, len(reqs)), make([]error, len(reqs))
				before := scriptCalls(t, raw)
				s.AllowEach(ctx, reqs, out, errs)
				if !cluster {
					assert.EqualValues(t, 1, scriptCalls(t, raw)-before, "round %d: one script call", round)
				}
				for i, r := range batch("turn-") {
					want, werr := s.Allow(ctx, r.Key, r.Cost, r.Policy)
					if werr != nil {
						require.Error(t, errs[i], "round %d request %d", round, i)
						assert.Equal(t, werr.Error(), errs[i].Error())
						continue
					}
					require.NoError(t, errs[i], "round %d request %d", round, i)
					assert.Equal(t, want.Allowed, out[i].Allowed, "round %d request %d", round, i)
					assert.InDelta(t, want.Remaining, out[i].Remaining, 0.01, "round %d request %d", round, i)
					assert.InDelta(t, want.RetryAfter, out[i].RetryAfter, float64(time.Second), "round %d request %d", round, i)
					assert.InDelta(t, want.ResetAfter, out[i].ResetAfter, float64(time.Second), "round %d request %d", round, i)
				}
			}
			// Round 0 spent a 2+2+1, b 1; then a is out, b goes on until 3.
			left := func(key string) int { n, _ := raw.Exists(ctx, redisstore.Key(key)).Result(); return int(n) }
			assert.Equal(t, 1, left("each-a"))
			assert.Equal(t, 0, left("each-c"), "a refused request sends nothing")
		})
	}
}

// Callers on many goroutines, each deciding the same three keys in one
// AllowEach while others call Allow, share round trips; every key admits
// exactly its burst, never a request twice or none.
func TestRedisAllowEachConcurrent(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, srv.URL())
	ctx := context.Background()
	const burst = 300
	p := store.Policy{Rate: 1.0 / 3600, Burst: burst}
	var wg sync.WaitGroup
	var mu sync.Mutex
	allowed := map[string]int{}
	var failed error
	for g := range 8 {
		wg.Go(func() {
			keys := []string{"x", "y", "z"}
			reqs := make([]store.Request, len(keys))
			for i, k := range keys {
				reqs[i] = store.Request{Key: k, Cost: 1, Policy: p}
			}
			out, errs := make([]store.Result, len(keys)), make([]error, len(keys))
			for range 60 {
				if g%2 == 0 {
					s.AllowEach(ctx, reqs, out, errs)
				} else {
					for i, r := range reqs {
						out[i], errs[i] = s.Allow(ctx, r.Key, r.Cost, r.Policy)
					}
				}
				mu.Lock()
				for i, k := range keys {
					if errs[i] != nil {
						failed = errs[i]
					} else if out[i].Allowed {
						allowed[k]++
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.NoError(t, failed)
	// 8·60 = 480 requests per key against a burst of 300.
	assert.Equal(t, map[string]int{"x": burst, "y": burst, "z": burst}, allowed)
}

// A context already ended sends nothing and fails every request; a Redis
// that does not answer fails every request within the store's timeout.
func TestRedisAllowEachBounded(t *testing.T) {
	srv := redistest.Start(t)
	proxy := newStallProxy(t, srv.Addr())
	s, err := redisstore.Open("redis://"+proxy.ln.Addr().String()+"/0", redisstore.WithTimeout(300*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	p := store.Policy{Rate: 100, Burst: 10}
	reqs := []store.Request{{Key: "a", Cost: 1, Policy: p}, {Key: "b", Cost: 1, Policy: p}}
	out, errs := make([]store.Result, 2), make([]error, 2)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.AllowEach(ctx, reqs, out, errs)
	for _, err := range errs {
		assert.ErrorIs(t, err, context.Canceled)
	}

	s.AllowEach(context.Background(), reqs, out, errs)
	require.Equal(t, []error{nil, nil}, errs)
	assert.Equal(t, []bool{true, true}, []bool{out[0].Allowed, out[1].Allowed})

	proxy.setStalled(true)
	start := time.Now()
	s.AllowEach(context.Background(), reqs, out, errs)
	took := time.Since(start)
	proxy.setStalled(false)
	for i, err := range errs {
		assert.Error(t, err, "request %d", i) // the read's timeout or the store's bound
		assert.Equal(t, store.Result{}, out[i])
	}
	assert.GreaterOrEqual(t, took, 250*time.Millisecond, "a reply was waited for")
	assert.Less(t, took, 3*time.Second, "within the store's timeout, not go-redis's default")
}

// BenchmarkRedisAllowEach decides three keys per op, in one AllowEach
// ("each") or one Allow after another ("turn"), from one goroutine: the
// latency of a request with three descriptors.
func BenchmarkRedisAllowEach(b *testing.B) {
	srv := redistest.Start(b)
	s, err := redisstore.Open(srv.URL())
	require.NoError(b, err)
	defer s.Close()
	p := store.Policy{Rate: 1e6, Burst: 1000}
	reqs := make([]store.Request, 3)
	for i := range reqs {
		reqs[i] = store.Request{Key: "bench-" + strconv.Itoa(i), Cost: 1, Policy: p}
	}
	out, errs := make([]store.Result, 3), make([]error, 3)
	ctx := context.Background()
	b.Run("each", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s.AllowEach(ctx, reqs, out, errs)
		}
	})
	b.Run("turn", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for i, r := range reqs {
				out[i], errs[i] = s.Allow(ctx, r.Key, r.Cost, r.Policy)
			}
		}
	})
}
