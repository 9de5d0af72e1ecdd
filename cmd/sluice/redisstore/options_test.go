package redisstore

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestOpenersSetTheSameClientOptions: Open, OpenCluster and OpenSentinel
// each hand go-redis the settings failFast names (no replay, one dial, the
// store's timeout, RESP2, the context's deadline on the socket, no CLIENT
// SETINFO), and a URL's own timeout stands. None of them dials.
func TestOpenersSetTheSameClientOptions(t *testing.T) {
	const d = 123 * time.Millisecond
	type settings struct {
		maxRetries, dialerRetries, protocol int
		dial, read, write                   time.Duration
		contextTimeout, noIdentity          bool
	}
	// No retries is −1 in the options given, and 0 once go-redis has
	// initialised them (Options, not ClusterOptions); its default is 3.
	none := func(n int) int {
		if n == -1 {
			return 0
		}
		return n
	}
	want := settings{0, 1, 2, d, 2 * time.Second, d, true, true}
	of := func(s *Store) settings {
		t.Cleanup(func() { _ = s.Close() })
		switch c := s.client().(type) {
		case *redis.Client: // Open's, and OpenSentinel's failover client
			o := c.Options()
			return settings{none(o.MaxRetries), o.DialerRetries, o.Protocol, o.DialTimeout, o.ReadTimeout, o.WriteTimeout,
				o.ContextTimeoutEnabled, o.DisableIdentity}
		case *redis.ClusterClient:
			o := c.Options()
			assert.Equal(t, 0, none(o.MaxRedirects), "a redirect is a retry")
			return settings{none(o.MaxRetries), o.DialerRetries, o.Protocol, o.DialTimeout, o.ReadTimeout, o.WriteTimeout,
				o.ContextTimeoutEnabled, o.DisableIdentity}
		}
		t.Fatalf("client %T", s.client())
		return settings{}
	}
	s, err := Open("redis://127.0.0.1:1?read_timeout=2s", WithTimeout(d))
	require.NoError(t, err)
	assert.Equal(t, want, of(s), "Open")
	s, err = OpenCluster("rediscluster://127.0.0.1:1?read_timeout=2s", WithTimeout(d))
	require.NoError(t, err)
	assert.Equal(t, want, of(s), "OpenCluster")
	s, err = OpenSentinel("redis-sentinel://127.0.0.1:1/mymaster", WithTimeout(d))
	require.NoError(t, err)
	want.read = d // its URL sets no timeouts
	assert.Equal(t, want, of(s), "OpenSentinel")
}
