package redisstore_test

import (
	"context"
	_ "embed"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/redisstore"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/store"
)

// arrayReplyLua is the script of the releases whose reply is four integers
// (allowed, remaining ns, reset-after ns, retry-after ns) and whose
// arguments are T, tau and cost. It stores the TAT as gcra.lua does.
//
//go:embed testdata/gcra_array_reply.lua
var arrayReplyLua string

// During a rolling upgrade, processes running the array-reply script and
// processes running gcra.lua share keys. Each reads the other's TAT
// exactly: ten alternating requests of one token drain a bucket of ten one
// token at a time, whichever script answers, and the eleventh is denied by
// both.
func TestRedisSharesKeysWithArrayReplyScript(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, srv.URL())
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer raw.Close()
	ctx := context.Background()
	p := store.Policy{Rate: 1.0 / 3600, Burst: 10} // no refill to speak of within the test
	T := int64(p.Interval())
	old := redis.NewScript(arrayReplyLua)
	oldAllow := func(key string) store.Result {
		v, err := old.Run(ctx, raw, []string{redisstore.Key(key)}, T, T*p.Burst, 1).Int64Slice()
		require.NoError(t, err)
		require.Len(t, v, 4)
		return store.Result{Allowed: v[0] == 1, Remaining: float64(v[1]) / float64(T),
			ResetAfter: time.Duration(v[2]), RetryAfter: time.Duration(v[3])}
	}
	newAllow := func(key string) store.Result {
		r, err := s.Allow(ctx, key, 1, p)
		require.NoError(t, err)
		return r
	}
	for _, first := range []string{"array-reply", "gcra.lua"} {
		t.Run(first+" first", func(t *testing.T) {
			key := "upgrade-" + first
			for i := range 10 {
				var r store.Result
				if (i%2 == 0) == (first == "array-reply") {
					r = oldAllow(key)
				} else {
					r = newAllow(key)
				}
				require.True(t, r.Allowed, "request %d", i)
				assert.InDelta(t, float64(9-i), r.Remaining, 0.001, "request %d", i)
				assert.InDelta(t, float64(i+1), r.ResetAfter.Seconds()/time.Duration(T).Seconds(), 0.001, "request %d", i)
			}
			for _, r := range []store.Result{oldAllow(key), newAllow(key)} {
				assert.False(t, r.Allowed)
				assert.InDelta(t, 0, r.Remaining, 0.001)
				assert.InDelta(t, 10, r.ResetAfter.Seconds()/time.Duration(T).Seconds(), 0.001)
				assert.InDelta(t, 1, r.RetryAfter.Seconds()/time.Duration(T).Seconds(), 0.001)
			}
		})
	}
}

// A TAT whose nanoseconds are written without leading zeros ("S 5", as
// "%d %d" writes them) reads as S seconds and 5 ns.
func TestRedisReadsUnpaddedNanoseconds(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, srv.URL())
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer raw.Close()
	ctx := context.Background()
	p := store.Policy{Rate: 0.1, Burst: 20} // T = 10 s, tau = 200 s

	start := time.Now()
	now, err := raw.Time(ctx).Result() // Redis's clock, which the script reads
	require.NoError(t, err)
	tat := time.Unix(now.Unix()+99, 5)
	require.NoError(t, raw.Set(ctx, redisstore.Key("k"), strconv.FormatInt(tat.Unix(), 10)+" 5", time.Hour).Err())
	r, err := s.Allow(ctx, "k", 10, p)
	late := time.Since(start) // at most how much later than now the script ran
	require.NoError(t, err)
	require.True(t, r.Allowed, "about 10 of 20 tokens are there")
	// The debt after: TAT − (script's now) + 100 s, and the script's now is
	// in [now, now + late].
	want := tat.Sub(now) + 100*time.Second
	assert.LessOrEqual(t, r.ResetAfter, want)
	assert.GreaterOrEqual(t, r.ResetAfter, want-late)
	assert.Equal(t, 5, int(r.ResetAfter%1000), "the 5 ns count: Redis's clock has microseconds, so only the TAT has a ns digit")
}

// TestStoredFormatShared: gcra.lua (Allow) and gcra_all.lua (DecideAll)
// each read and write a key's TAT with their own copy of the code (scripts
// cannot share it); each reads what the other wrote exactly: alternating
// requests of one token drain a bucket of ten one token at a time, and the
// eleventh is denied by both, with the same figures.
func TestStoredFormatShared(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, srv.URL())
	ctx := context.Background()
	p := store.Policy{Rate: 1.0 / 3600, Burst: 10} // no refill to speak of within the test
	T := time.Duration(p.Interval())
	allow := func(i int) store.Result {
		r, err := s.Allow(ctx, "shared", 1, p)
		require.NoError(t, err, "request %d", i)
		return r
	}
	all := func(i int) store.Result {
		out := make([]store.Result, 1)
		_, err := s.DecideAll(ctx, []store.Request{{Key: "shared", Cost: 1, Policy: p}}, true, out)
		require.NoError(t, err, "request %d", i)
		return out[0]
	}
	for i := range 10 {
		decide := allow
		if i%2 == 1 {
			decide = all
		}
		r := decide(i)
		require.True(t, r.Allowed, "request %d", i)
		assert.InDelta(t, float64(9-i), r.Remaining, 0.001, "request %d", i)
		assert.InDelta(t, float64(i+1), r.ResetAfter.Seconds()/T.Seconds(), 0.001, "request %d", i)
	}
	for i, r := range []store.Result{allow(10), all(11)} {
		assert.False(t, r.Allowed, "request %d", 10+i)
		assert.InDelta(t, 10, r.ResetAfter.Seconds()/T.Seconds(), 0.001, "request %d", 10+i)
		assert.InDelta(t, 1, r.RetryAfter.Seconds()/T.Seconds(), 0.001, "request %d", 10+i)
	}
}
