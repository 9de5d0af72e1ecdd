package redisstore

import (
	"context"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/redistest"
)

// batchOf is a batch of calls: per key, calls[key] calls of cost·T = 1000
// under tau = 10^9, in turn across keys.
func batchOf(keys []string, calls []int) []*call {
	var batch []*call
	for round := 0; ; round++ {
		added := false
		for k, key := range keys {
			if round < calls[k] {
				batch = append(batch, &call{keys: []string{key}, inc: 1000, tau: 1e9, args: make([]any, 2), done: make(chan struct{}, 1)})
				added = true
			}
		}
		if !added {
			return batch
		}
	}
}

// A shared batch on a server that has not seen the script (NOSCRIPT) is
// sent again with the script's text and charged once: each call on a
// fresh key gets exactly the debt its key's calls before it and its own
// left. On Cluster the batch spans slots, several keys sharing some.
func TestExecSharedBatchAfterNoScript(t *testing.T) {
	keys := []string{Key("a"), Key("b"), Key("tag}c"), Key("tag}d"), Key("tag}e"), Key("f")}
	calls := []int{3, 1, 2, 1, 4, 1}
	for _, client := range []string{"single", "fast", "cluster"} {
		t.Run(client, func(t *testing.T) {
			var srv *redistest.Server
			var cn *conn
			switch client {
			case "cluster":
				srv = redistest.StartCluster(t)
				cn = &conn{c: redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr()}, Protocol: 2, MaxRetries: -1, MaxRedirects: -1})}
			default:
				srv = redistest.Start(t)
				opt := &redis.Options{Addr: srv.Addr(), Protocol: 2, MaxRetries: -1}
				cn = &conn{c: redis.NewClient(opt)}
				if client == "fast" {
					cn.fast = newFast(opt, time.Second)
				}
			}
			defer cn.close()
			raw := redis.NewClient(&redis.Options{Addr: srv.Addr()})
			defer raw.Close()

			batch := batchOf(keys, calls)
			exec(context.Background(), cn, batch)
			seen := map[string]int64{}
			for i, b := range batch {
				require.NoError(t, b.err, "call %d", i)
				seen[b.keys[0]] += 1000
				assert.Equal(t, seen[b.keys[0]], b.v, "call %d on %s", i, b.keys[0])
			}
			stats := commandCalls(t, raw)
			assert.Equal(t, stats["eval"], stats["evalsha"], "each script call sent again once")
			want := int64(1)
			if client == "cluster" {
				want = 4 // a, b, f and the "tag" slot
			}
			assert.Equal(t, want, stats["eval"], "script calls")
		})
	}
}

var commandStat = regexp.MustCompile(`cmdstat_(\w+):calls=(\d+)`)

// commandCalls is INFO commandstats' calls per command.
func commandCalls(t *testing.T, raw *redis.Client) map[string]int64 {
	info, err := raw.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	n := map[string]int64{}
	for _, m := range commandStat.FindAllStringSubmatch(info, -1) {
		v, err := strconv.ParseInt(m[2], 10, 64)
		require.NoError(t, err)
		n[m[1]] = v
	}
	return n
}

// plan packs keys into as few script calls as the client allows, within
// maxScript requests a call, never splitting a key's calls.
func TestPlan(t *testing.T) {
	one := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer one.Close()
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cluster.Close()
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()

	keys := make([]string, 512)
	calls := make([]int, len(keys))
	for i := range keys {
		keys[i], calls[i] = Key("k"+strconv.Itoa(i)), 1
	}
	sizes := func(scripts []script) (keys, reqs []int) {
		for _, s := range scripts {
			keys, reqs = append(keys, len(s.keys)), append(reqs, s.n)
		}
		return keys, reqs
	}

	k, n := sizes(plan(one, byKey(batchOf(keys, calls))))
	assert.Equal(t, []int{256, 256}, k, "keys per script call")
	assert.Equal(t, []int{256, 256}, n)

	calls[0] = 300 // a hot key: its calls stay in one script call
	k, n = sizes(plan(one, byKey(batchOf(keys[:11], calls[:11]))))
	assert.Equal(t, []int{1, 10}, k)
	assert.Equal(t, []int{300, 10}, n)

	k, _ = sizes(plan(ring, byKey(batchOf(keys[1:4], calls[1:4]))))
	assert.Equal(t, []int{1, 1, 1}, k, "a Ring: one key per call")

	tagged := []string{Key("x"), Key("tag}1"), Key("y"), Key("tag}2"), Key("tag}3")}
	scripts := plan(cluster, byKey(batchOf(tagged, []int{1, 2, 1, 1, 1})))
	require.Len(t, scripts, 3)
	for _, s := range scripts {
		for _, key := range s.keys {
			assert.Equal(t, slot(s.keys[0]), slot(key), "one slot per script call")
		}
		if len(s.keys) > 1 {
			assert.Equal(t, []string{Key("tag}1"), Key("tag}2"), Key("tag}3")}, s.keys, "queue order within a slot")
			assert.Equal(t, []any{2, int64(1000), int64(1e9), int64(1000), int64(1e9), 1, int64(1000), int64(1e9), 1, int64(1000), int64(1e9)}, s.goArgs())
			assert.Equal(t, []string{"2", "1000", "1000000000", "1000", "1000000000", "1", "1000", "1000000000", "1", "1000", "1000000000"}, s.strArgs(), "the same for rueidis")
		}
	}
}
