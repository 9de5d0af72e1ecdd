package main_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/redistest"
)

// failoverBound is how soon decisions resume after the master dies: the
// sentinel's down-after (500 ms in redistest), its election and promotion,
// and the breaker's next probe, with room for a loaded machine.
const failoverBound = 20 * time.Second

// A master, a replica and a sentinel on loopback, all requiring AUTH; the
// master is killed mid-run. Meanwhile decisions follow -fail closed (429,
// "degraded"); once the sentinel has promoted the replica they resume on
// it, within failoverBound.
func TestServeRedisSentinelFailover(t *testing.T) {
	const pw = "s3cret"
	master := redistest.StartWith(t, "--requirepass", pw, "--masterauth", pw)
	replica := redistest.StartWith(t, "--requirepass", pw, "--masterauth", pw,
		"--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr(), Password: pw})
	defer rc.Close()
	require.Eventually(t, func() bool {
		info, err := rc.Info(context.Background(), "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	}, 20*time.Second, 10*time.Millisecond, "the replica never synced")
	sen := redistest.StartSentinel(t, "mymaster", master, pw)
	sc := redis.NewSentinelClient(&redis.Options{Addr: sen.Addr()})
	defer sc.Close()
	require.Eventually(t, func() bool {
		r, err := sc.Replicas(context.Background(), "mymaster").Result()
		return err == nil && len(r) == 1
	}, 20*time.Second, 10*time.Millisecond, "the sentinel never saw the replica")

	s := serve(t, "-store", fmt.Sprintf("redis-sentinel://:%s@%s/mymaster/0", pw, sen.Addr()),
		"-fail", "closed", "-store-timeout", "200ms", "-rate", "0.01", "-burst", "1000") // a spent token stays 100 s
	r := get(t, s.URL+"/allow?key=k")
	require.Equal(t, 200, r.status, r.body)
	require.NotContains(t, r.body, "degraded")

	master.Kill()
	killed := time.Now()
	var degraded int
	require.Eventually(t, func() bool {
		r := get(t, s.URL+"/allow?key=k")
		if strings.Contains(r.body, "degraded") {
			degraded++
			assert.Equal(t, 429, r.status, "-fail closed while the master is down: %s", r.body)
			return false
		}
		return r.status == 200
	}, failoverBound, 20*time.Millisecond, "decisions never resumed:\n%s", s.logs.String())
	t.Logf("decisions resumed %v after the master was killed (%d degraded answers meanwhile)",
		time.Since(killed).Round(10*time.Millisecond), degraded)
	assert.Positive(t, degraded, "the outage was seen and answered per -fail")
	addr, err := sc.GetMasterAddrByName(context.Background(), "mymaster").Result()
	require.NoError(t, err)
	assert.Equal(t, []string{"127.0.0.1", strconv.Itoa(replica.Port)}, addr, "the replica is the master now")
	require.Equal(t, 200, get(t, s.URL+"/allow?key=after-failover").status)
	keys, err := rc.Keys(context.Background(), "sluice:*after-failover*").Result()
	require.NoError(t, err)
	assert.Len(t, keys, 1, "a decision after the failover is kept on the promoted replica")
	assert.Equal(t, 0, s.stop(t))
	assert.Contains(t, s.logs.String(), "store recovered")
}

// Redis AUTH from the URL: the default user's password, and an ACL user.
func TestServeRedisAuth(t *testing.T) {
	rs := redistest.StartWith(t, "--requirepass", "pw", "--user", "alice", "on", ">alicepw", "~*", "&*", "+@all")
	for _, c := range []struct {
		name, userinfo string
		ok             bool
	}{
		{"default user", ":pw", true},
		{"ACL user", "alice:alicepw", true},
		{"wrong password", "alice:nope", false},
		{"no password", "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			url := "redis://" + rs.Addr() + "/0"
			if c.userinfo != "" {
				url = "redis://" + c.userinfo + "@" + rs.Addr() + "/0"
			}
			s := serve(t, "-store", url, "-fail", "closed", "-store-timeout", "200ms")
			r := get(t, s.URL+"/allow?key=k")
			if c.ok {
				assert.Equal(t, 200, r.status, r.body)
				assert.NotContains(t, r.body, "degraded")
			} else {
				assert.Equal(t, 429, r.status, r.body)
				assert.Contains(t, r.body, "degraded")
				assert.NotContains(t, s.logs.String(), "alicepw", "no password in the logs")
			}
			assert.Equal(t, 0, s.stop(t))
			if !c.ok {
				assert.Regexp(t, "WRONGPASS|NOAUTH", s.logs.String(), "the log says why")
			}
		})
	}
}
