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

// Calls in flight at once on distinct keys share script calls, not only
// round trips: 16 goroutines, each calling on its own key without pause
// (BenchmarkRedis's 16g row), make at most one script call per 4 requests,
// and every key ends exactly as many tokens down as it was called. On
// Cluster, where one script call takes keys of one hash slot only, the same
// holds for keys that share a hash tag.
func TestRedisDistinctKeysShareScriptCalls(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		srv := redistest.Start(t)
		distinctKeys(t, open(t, srv.URL()), srv.Addr(), "g")
	})
	t.Run("cluster", func(t *testing.T) {
		srv := redistest.StartCluster(t)
		s := openCluster(t, srv)
		// Key("tag}g3") is "sluice:{tag}g3}", whose hash tag is "tag": one slot.
		distinctKeys(t, s, srv.Addr(), "tag}g")
	})
}

func distinctKeys(t *testing.T, s *redisstore.Store, addr, prefix string) {
	raw := redis.NewClient(&redis.Options{Addr: addr})
	defer raw.Close()
	ctx := context.Background()
	p := store.Policy{Rate: 1.0 / 3600, Burst: 1000} // no refill within the test
	_, err := s.Allow(ctx, "warm", 1, p)             // loads the script
	require.NoError(t, err)
	before := scriptCalls(t, raw)

	const goroutines, each = 16, 300
	var wg sync.WaitGroup
	start := make(chan struct{})
	last := make([]store.Result, goroutines)
	errs := make([]error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			<-start
			key := prefix + strconv.Itoa(g)
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
	calls := scriptCalls(t, raw) - before
	for g := range goroutines {
		require.NoError(t, errs[g])
		assert.True(t, last[g].Allowed)
		assert.InDelta(t, 1000-each, last[g].Remaining, 0.01, "goroutine %d: each call charged once", g)
	}
	requests := int64(goroutines * each)
	t.Logf("%d requests on %d keys decided by %d script calls", requests, goroutines, calls)
	assert.LessOrEqual(t, calls*4, requests, "calls in flight at once on distinct keys share a script call")
}

// Concurrent decisions on many keys are decided by far fewer script calls
// than requests, and every answer is the one a sequential replay of each
// key's requests in the order Redis applied them gives (gcra.Step, one call
// per request), on single Redis and on Redis Cluster. On Cluster three keys
// in four share a hash tag (one slot, so their calls share script calls)
// and the rest are each in a slot of their own.
func TestRedisManyKeysMatchSequentialReplay(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		srv := redistest.Start(t)
		manyKeysOracle(t, open(t, srv.URL()), srv.Addr(), 4)
	})
	t.Run("cluster", func(t *testing.T) {
		srv := redistest.StartCluster(t)
		s := openCluster(t, srv)
		manyKeysOracle(t, s, srv.Addr(), 2)
	})
}

// manyKeysOracle sends requests of mixed costs under two policies of one
// rate (bursts 40 and 25) from 32 goroutines over 64 keys, each goroutine
// moving on to the next key at each request so that calls in flight at
// once are mostly on distinct keys, and checks each key's answers against
// a replay (see replayInAppliedOrder). It requires at most one script call
// per share requests.
func manyKeysOracle(t *testing.T, s *redisstore.Store, addr string, share int64) {
	raw := redis.NewClient(&redis.Options{Addr: addr})
	defer raw.Close()
	ctx := context.Background()
	big := store.Policy{Name: "big", Rate: 1.0 / 3600, Burst: 40}
	small := store.Policy{Name: "small", Rate: 1.0 / 3600, Burst: 25}
	T := big.Interval()
	_, err := s.Allow(ctx, "warm", 1, big) // loads the script
	require.NoError(t, err)
	before := scriptCalls(t, raw)

	const goroutines, each, nkeys = 32, 60, 64
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
		if i%4 != 0 {
			keys[i] = "tag}" + keys[i] // hash tag "tag" on Cluster
		}
	}
	type keyed struct {
		key int
		oracleReq
	}
	reqs := make([][]keyed, goroutines)
	var wg sync.WaitGroup
	startGate := make(chan struct{})
	for g := range goroutines {
		reqs[g] = make([]keyed, each)
		wg.Go(func() {
			<-startGate
			for i := range reqs[g] {
				q := &reqs[g][i]
				q.key = (g*2 + i) % nkeys
				q.cost, q.p = int64((g*7+i)%5+1), big
				if (g+i)%3 == 0 {
					q.p = small
				}
				q.r, q.err = s.Allow(ctx, keys[q.key], q.cost, q.p)
			}
		})
	}
	start := time.Now()
	close(startGate)
	wg.Wait()
	e := time.Since(start)
	require.Less(t, e, T/100, "the test is short against T")
	calls := scriptCalls(t, raw) - before

	byKey := make([][]oracleReq, nkeys)
	n := 0
	for g := range reqs {
		for _, q := range reqs[g] {
			require.NoError(t, q.err)
			byKey[q.key] = append(byKey[q.key], q.oracleReq)
			n++
		}
	}
	t.Logf("%d requests on %d keys decided by %d script calls in %v", n, nkeys, calls, e)
	assert.LessOrEqual(t, calls*share, int64(n), "calls in flight at once on distinct keys share script calls")
	allowed := 0
	for k, all := range byKey {
		allowed += replayInAppliedOrder(t, keys[k], all, T, e)
	}
	assert.Greater(t, allowed, 500, "enough allowed requests to order")
	assert.Greater(t, n-allowed, 500, "enough denials")
}
