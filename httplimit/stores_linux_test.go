//go:build linux

package httplimit_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/httplimit"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/shmstore"
)

// TestMiddlewareShm: two servers, each with its own shmstore over one
// directory (as two processes on a host would have), share one limit per IP.
func TestMiddlewareShm(t *testing.T) {
	dir := t.TempDir()
	var stores [2]store.Store
	for i := range stores {
		st, err := shmstore.Open(dir)
		require.NoError(t, err)
		t.Cleanup(func() { _ = st.Close() })
		stores[i] = st
	}
	urls := twoHosts(t, stores, store.Policy{Name: "api", Rate: 1.0 / 60, Burst: 3})
	assert.Equal(t, []int{200, 200, 200, 429, 429}, alternate(t, urls, 5))
	assert.Equal(t, "60", get(t, urls[1]).header.Get("Retry-After"))
}

// twoHosts serves two loopback servers, each with its own middleware over
// its own store (as two hosts would have), and returns their URLs.
func twoHosts(t *testing.T, stores [2]store.Store, p store.Policy, opts ...httplimit.MiddlewareOption) [2]string {
	var urls [2]string
	for i, st := range stores {
		lim, err := httplimit.NewMiddleware(st, p, opts...)
		require.NoError(t, err)
		urls[i] = serve(t, lim.Handler(hello)).URL
	}
	return urls
}

// alternate sends n requests, alternating between the two hosts, and
// returns the statuses.
func alternate(t *testing.T, urls [2]string, n int, hdr ...string) []int {
	var codes []int
	for i := range n {
		codes = append(codes, get(t, urls[i%2], hdr...).status)
	}
	return codes
}
