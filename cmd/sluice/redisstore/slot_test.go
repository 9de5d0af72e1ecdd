package redisstore

import (
	"context"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/redistest"
)

// slot follows Redis Cluster's hash slots: published values, the hash tag
// rule's corner cases, and a real cluster's CLUSTER KEYSLOT for many keys.
func TestSlot(t *testing.T) {
	assert.Equal(t, uint16(12182), slot("foo"))
	assert.Equal(t, uint16(0x31C3), slot("123456789"), "CRC16/XMODEM's check value")
	assert.Equal(t, slot("user1000"), slot("{user1000}.following"))
	assert.Equal(t, slot("bar"), slot("foo{bar}{zap}"), "the first tag")
	assert.Equal(t, slot("{bar"), slot("foo{{bar}}zap"), "from the first '{' to the first '}' after it")
	assert.NotEqual(t, slot("bar"), slot("foo{}{bar}"), "an empty tag: the whole key")

	srv := redistest.StartCluster(t)
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer raw.Close()
	ctx := context.Background()
	keys := []string{"", "foo", "{}", "{", "}", "a{b}c", "a{}b{c}", "{{}}", "x}y{z}", "héllo", Key("ten{ant}"), Key("tag}g1")}
	for i := range 300 {
		keys = append(keys, Key("k"+strconv.Itoa(i)), "bench-"+strconv.Itoa(i))
	}
	for _, k := range keys {
		want, err := raw.ClusterKeySlot(ctx, k).Result()
		require.NoError(t, err)
		assert.Equal(t, uint16(want), slot(k), "key %q", k)
	}
}
