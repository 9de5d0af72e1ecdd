//go:build linux

package httplimit_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/service/store"
	"github.com/sluice-go/sluice/service/store/shmstore"
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
