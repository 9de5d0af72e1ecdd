package redisstore_test

import (
	"cmp"
	"context"
	"math"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/redisstore"
	"github.com/sluice-go/sluice/internal/gcra"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/store"
)

// Concurrent decisions on one key are decided by fewer script calls than
// requests, and every answer is the one a sequential replay of the same
// requests in the order Redis applied them gives (gcra.Step, one call
// per request), on single Redis and on Redis Cluster.
func TestRedisHotKeyMatchesSequentialReplay(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		srv := redistest.Start(t)
		hotKeyOracle(t, open(t, srv.URL()), srv.Addr())
	})
	t.Run("cluster", func(t *testing.T) {
		srv := redistest.StartCluster(t)
		s := openCluster(t, srv)
		hotKeyOracle(t, s, srv.Addr())
	})
}

// hotKeyOracle sends requests of mixed costs under two policies of one rate
// (bursts 1000 and 600) from 32 goroutines at one key, and checks the
// answers against a replay through gcra.Step in the order Redis applied
// them (see replayInAppliedOrder).
func hotKeyOracle(t *testing.T, s *redisstore.Store, addr string) {
	raw := redis.NewClient(&redis.Options{Addr: addr})
	defer raw.Close()
	ctx := context.Background()
	big := store.Policy{Name: "big", Rate: 1.0 / 3600, Burst: 1000}
	small := store.Policy{Name: "small", Rate: 1.0 / 3600, Burst: 600}
	T := big.Interval()
	_, err := s.Allow(ctx, "warm", 1, big) // loads the script
	require.NoError(t, err)
	before := scriptCalls(t, raw)

	const goroutines, each = 32, 60
	reqs := make([][]oracleReq, goroutines)
	var wg sync.WaitGroup
	startGate := make(chan struct{})
	for g := range goroutines {
		reqs[g] = make([]oracleReq, each)
		wg.Go(func() {
			<-startGate
			for i := range reqs[g] {
				q := &reqs[g][i]
				q.cost, q.p = int64((g*7+i)%5+1), big
				if g%2 == 1 {
					q.p = small
				}
				q.r, q.err = s.Allow(ctx, "hot", q.cost, q.p)
			}
		})
	}
	start := time.Now()
	close(startGate)
	wg.Wait()
	e := time.Since(start)
	require.Less(t, e, T/100, "the test is short against T")
	calls := scriptCalls(t, raw) - before

	var all []oracleReq
	for g := range reqs {
		for _, q := range reqs[g] {
			require.NoError(t, q.err)
			all = append(all, q)
		}
	}
	t.Logf("%d requests decided by %d script calls in %v", len(all), calls, e)
	assert.Less(t, calls, int64(len(all)), "requests on one key in flight at once share a script call")
	allowed := replayInAppliedOrder(t, "hot", all, T, e)
	assert.Greater(t, allowed, 100, "enough allowed requests to order")
	assert.Greater(t, len(all)-allowed, 100, "enough denials")
}

// oracleReq is one request of an oracle test and its answer.
type oracleReq struct {
	cost int64
	p    store.Policy
	r    store.Result
	err  error
}

// replayInAppliedOrder checks the answers to all, requests on one key under
// policies of one interval T (one token an hour, so that e, the test's
// duration, is short against it), against a replay through gcra.Step and
// gcra.Figures in the order Redis applied them, and returns how many were
// allowed.
//
// The order is read off the answers: an allowed request's ResetAfter is the
// bucket's debt after it, c·T − e' (0 ≤ e' ≤ e) for c tokens spent so far,
// and a denied one's is the debt it found. So allowed requests sort by c (no
// two may share one: that would be a double spend, which the replay then
// shows), and a denial goes after the allowed request that left the debt it
// saw (denials change nothing, so their order among themselves does not
// matter).
func replayInAppliedOrder(t *testing.T, key string, all []oracleReq, T, e time.Duration) int {
	t.Helper()
	tokens := func(d time.Duration) int64 { return int64(math.Round(float64(d) / float64(T))) }
	slices.SortStableFunc(all, func(a, b oracleReq) int {
		ka, kb := tokens(a.r.ResetAfter), tokens(b.r.ResetAfter)
		if c := cmp.Compare(ka, kb); c != 0 {
			return c
		}
		switch { // at one debt: the allowed request that left it, then the denials that saw it
		case a.r.Allowed && !b.r.Allowed:
			return -1
		case !a.r.Allowed && b.r.Allowed:
			return 1
		}
		return 0
	})
	var tat int64
	allowed := 0
	for i, q := range all {
		need, tau := q.cost*int64(T), int64(q.p.Tolerance())
		next, ok := gcra.Step(tat, 0, need, tau-need)
		want := gcra.Figures(ok, next, need, int64(T), tau)
		if ok {
			tat = next
		}
		require.Equal(t, want.Allowed, q.r.Allowed, "key %s: request %d in applied order (cost %d, %s)", key, i, q.cost, q.p.Name)
		assert.InDelta(t, want.Remaining, q.r.Remaining, float64(e)/float64(T)+1e-9, "key %s: request %d remaining", key, i)
		assert.InDelta(t, float64(want.ResetAfter), float64(q.r.ResetAfter), float64(e), "key %s: request %d reset-after", key, i)
		assert.InDelta(t, float64(want.RetryAfter), float64(q.r.RetryAfter), float64(e), "key %s: request %d retry-after", key, i)
		if q.r.Allowed {
			allowed++
		}
	}
	return allowed
}

var evalCalls = regexp.MustCompile(`cmdstat_eval(?:sha)?:calls=(\d+)`)

// scriptCalls is the number of EVAL and EVALSHA calls the server has run.
func scriptCalls(t *testing.T, raw *redis.Client) int64 {
	info, err := raw.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	var n int64
	for _, m := range evalCalls.FindAllStringSubmatch(info, -1) {
		v, err := strconv.ParseInt(m[1], 10, 64)
		require.NoError(t, err)
		n += v
	}
	return n
}
