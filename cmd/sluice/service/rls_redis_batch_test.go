package service_test

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/redisstore"
	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/store"
)

// reads is how many reads Redis has made from its clients' sockets
// (INFO stats total_reads_processed), this INFO's own included: a
// pipelined write of a few commands is one read, so the difference of two
// is the round trips between them, plus one.
func reads(t *testing.T, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "stats").Result()
	require.NoError(t, err)
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_reads_processed:"); ok {
			n, err := strconv.Atoi(v)
			require.NoError(t, err, line)
			return n
		}
	}
	require.Fail(t, "no total_reads_processed in INFO stats", info)
	return 0
}

// scriptCalls is how many script calls (EVALSHA and EVAL) Redis has run
// since its statistics were last reset, from INFO commandstats.
func scriptCalls(t *testing.T, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	n := 0
	for line := range strings.SplitSeq(info, "\n") {
		line = strings.TrimSpace(line)
		name, rest, ok := strings.Cut(line, ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		v, err := strconv.Atoi(calls)
		require.NoError(t, err, line)
		n += v
	}
	return n
}

// A request with several descriptors that reach the Redis store is decided
// in one script call, so one round trip, as envoyproxy/ratelimit sends a
// request's descriptors in one pipeline; each descriptor still spends on
// its own (one over its limit does not stop the others), with the figures
// it would get alone. On a single node and on a Cluster (one hash slot per
// descriptor's key here, so one script call per slot, all in one pipeline).
func TestRLSSeveralDescriptorsOneRedisCall(t *testing.T) {
	for _, cluster := range []bool{false, true} {
		t.Run(map[bool]string{false: "node", true: "cluster"}[cluster], func(t *testing.T) {
			var st store.Store
			var rs *redistest.Server
			var err error
			if cluster {
				rs = redistest.StartCluster(t)
				st, err = redisstore.OpenCluster("rediscluster://" + rs.Addr())
			} else {
				rs = redistest.Start(t)
				st, err = redisstore.Open(rs.URL())
			}
			require.NoError(t, err)
			t.Cleanup(func() { _ = st.Close() })
			c, err := rules.Parse("r.yaml", []byte(rlsRules))
			require.NoError(t, err)
			srv, err := service.New(service.Config{
				Store: store.NewBreaker(st, store.BreakerOptions{}), Default: store.Policy{Rate: 1, Burst: 1},
				Fail: store.FailClosed, StoreTimeout: 5 * time.Second, Rules: c,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			})
			require.NoError(t, err)
			f := &rlsFixture{rls: serveGRPC(t, srv)}
			rc := redis.NewClient(&redis.Options{Addr: rs.Addr()})
			t.Cleanup(func() { _ = rc.Close() })

			promo, phone, ip := desc("kind", "promo", "phone", "555"), desc("phone", "555"), desc("client_ip", "203.0.113.9")
			// The first requests load the script (NOSCRIPT, then EVAL) and
			// open the client's connections.
			f.ask(t, "edge", 0, ip)
			f.ask(t, "sms", 0, desc("phone", "1"), desc("phone", "2"))
			require.NoError(t, rc.ConfigResetStat(context.Background()).Err())

			for i := 1; i <= 4; i++ {
				calls, trips := scriptCalls(t, rc), reads(t, rc)
				r := f.ask(t, "sms", 0, promo, phone, desc("fax", "1"), promo)
				trips = reads(t, rc) - trips - 1
				calls = scriptCalls(t, rc) - calls
				assert.Equal(t, 1, trips, "request %d: round trips to Redis for its descriptors", i)
				if !cluster { // on a Cluster, one script call per hash slot (here, per key)
					assert.Equal(t, 1, calls, "request %d: script calls for its descriptors", i)
				}
				// promo appears twice: its second descriptor counts the
				// first, as when decided one after another.
				switch i {
				case 1:
					assert.Equal(t, []rlsv3.RateLimitResponse_Code{OK, OK, OK, OK, OK}, codesOf(r))
					assert.EqualValues(t, []uint32{2, 39, 0, 1}, remaining(r))
				case 2:
					assert.Equal(t, []rlsv3.RateLimitResponse_Code{OVER, OK, OK, OK, OVER}, codesOf(r))
					assert.EqualValues(t, []uint32{0, 38, 0, 0}, remaining(r))
				default: // promo over, phone still spends
					assert.Equal(t, []rlsv3.RateLimitResponse_Code{OVER, OVER, OK, OK, OVER}, codesOf(r))
					assert.EqualValues(t, []uint32{0, uint32(40 - i), 0, 0}, remaining(r))
				}
				assert.Nil(t, r.Statuses[2].CurrentLimit, "no rule: nothing counted")
			}
		})
	}
}

func remaining(r *rlsv3.RateLimitResponse) []uint32 {
	out := make([]uint32, len(r.Statuses))
	for i, s := range r.Statuses {
		out[i] = s.LimitRemaining
	}
	return out
}

// With Redis killed, each descriptor of a request decided in one call
// follows the fail mode on its own and counts as a store error, as when
// decided one after another; unmatched ones stay OK.
func TestRLSSeveralDescriptorsRedisKilled(t *testing.T) {
	for _, open := range []bool{true, false} {
		t.Run(map[bool]string{true: "open", false: "closed"}[open], func(t *testing.T) {
			rs := redistest.Start(t)
			st, err := redisstore.Open(rs.URL())
			require.NoError(t, err)
			t.Cleanup(func() { _ = st.Close() })
			c, err := rules.Parse("r.yaml", []byte(rlsRules))
			require.NoError(t, err)
			srv, err := service.New(service.Config{
				Store: st, Default: store.Policy{Rate: 1, Burst: 1}, Fail: failMode(open),
				StoreTimeout: 5 * time.Second, Rules: c,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			})
			require.NoError(t, err)
			f := &rlsFixture{rls: serveGRPC(t, srv)}
			ts := httptest.NewServer(srv)
			t.Cleanup(ts.Close)

			a, b := desc("client_ip", "203.0.113.9"), desc("client_ip", "203.0.113.10")
			r := f.ask(t, "edge", 0, a, b)
			require.Equal(t, []rlsv3.RateLimitResponse_Code{OK, OK, OK}, codesOf(r))
			require.Equal(t, []uint32{9, 9}, remaining(r), "Redis decides")

			rs.Kill()
			r = f.ask(t, "edge", 0, a, desc("fax", "1"), b)
			if open {
				assert.Equal(t, []rlsv3.RateLimitResponse_Code{OK, OK, OK, OK}, codesOf(r))
				assert.Nil(t, r.Statuses[0].DurationUntilReset)
				assert.Nil(t, r.Statuses[2].DurationUntilReset)
			} else {
				assert.Equal(t, []rlsv3.RateLimitResponse_Code{OVER, OVER, OK, OVER}, codesOf(r))
				assert.Equal(t, time.Second, r.Statuses[0].DurationUntilReset.AsDuration())
				assert.Equal(t, time.Second, r.Statuses[2].DurationUntilReset.AsDuration())
			}
			assert.EqualValues(t, 10, r.Statuses[2].CurrentLimit.RequestsPerUnit)
			assert.Nil(t, r.Statuses[1].CurrentLimit)
			fr := (&fixture{ts: ts}).get(t, "/metrics").raw
			assert.Contains(t, fr, `sluice_store_errors_total{store="redis"} 2`)
			assert.Contains(t, fr, `sluice_decisions_total{policy="edge.client_ip",result="store_error"} 2`)
			assert.Contains(t, fr, `sluice_store_latency_seconds_count{store="redis"} 4`, "one per descriptor the store decided")
		})
	}
}

// A request with more descriptors than the one-call path keeps on its
// stack (8) is answered the same, each descriptor on its own bucket.
func TestRLSManyDescriptors(t *testing.T) {
	f := newRLS(t, rlsRules, nil)
	var ds []*ratelimitv3.RateLimitDescriptor
	for i := range 11 {
		ds = append(ds, desc("client_ip", "198.51.100."+strconv.Itoa(i%10)))
	}
	r := f.ask(t, "edge", 2, ds...)
	want := make([]uint32, 11)
	for i := range want {
		want[i] = 8
	}
	want[10] = 6 // the same address as the first: it counts the first's spend
	assert.Equal(t, want, remaining(r))
	assert.Equal(t, OK, r.OverallCode)
}
