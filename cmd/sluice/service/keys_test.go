package service

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAllowKey(t *testing.T) {
	for _, k := range []string{"tenant-a", "198.51.100.7", "a", "rl", "rls", "allo", "r:x", "alpha", "über"} {
		assert.Equal(t, k, allowKey(k), "an ordinary key is kept as written")
	}
	for _, k := range []string{"rls:edge|remote_address=198.51.100.7|5/second", "rls#00", "allow:http|key=a|5/second", "allow#", "~", "~tenant"} {
		got := allowKey(k)
		assert.Len(t, got, 65, k)
		assert.True(t, strings.HasPrefix(got, "~"), k)
	}
	assert.NotEqual(t, allowKey("~"), allowKey("~~"))
	assert.Equal(t, allowKey("rls:x"), allowKey("rls:x"))
}

// FuzzAllowKey: allowKey is injective, never names a rule's bucket (the
// prefixes of rules.BucketKey), and fits the shm store's 256-byte keys.
func FuzzAllowKey(f *testing.F) {
	for _, s := range [][2]string{{"tenant-a", "~tenant-a"}, {"rls:edge|k=v|5/second", "~"}, {"allow:http|key=a|1/day", "allow#ab"},
		{"r", "rls"}, {"a", "~a"}, {strings.Repeat("x", MaxKeyLen), "rls#" + strings.Repeat("0", 64)}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		if len(a) > MaxKeyLen || len(b) > MaxKeyLen {
			return // /allow refuses them before any key is made
		}
		ka, kb := allowKey(a), allowKey(b)
		require.Equal(t, a == b, ka == kb, "%q → %q, %q → %q", a, ka, b, kb)
		for _, p := range []string{"rls:", "rls#", "allow:", "allow#"} {
			require.False(t, strings.HasPrefix(ka, p), "%q → %q", a, ka)
		}
		require.LessOrEqual(t, len(ka), MaxKeyLen)
	})
}
