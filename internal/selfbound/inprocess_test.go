package selfbound_test

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/selfbound"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/shmstore"
)

// TestInProcessStores: the memory and shm stores promise no wait at all
// (a bound of 0); a breaker over one is the caller's to look through
// (decide.New does), and nothing else is in-process.
func TestInProcessStores(t *testing.T) {
	mem := store.NewMemory()
	t.Cleanup(func() { _ = mem.Close() })
	assertInProcess(t, mem, true)
	if runtime.GOOS == "linux" || runtime.GOOS == "darwin" {
		shm, err := shmstore.Open(t.TempDir())
		require.NoError(t, err)
		t.Cleanup(func() { _ = shm.Close() })
		assertInProcess(t, shm, true)
	}
	br := store.NewBreaker(mem, store.BreakerOptions{})
	t.Cleanup(func() { _ = br.Close() })
	assertInProcess(t, br, false)
	assertInProcess(t, nil, false)
	assertInProcess(t, struct{}{}, false)
}

func assertInProcess(t *testing.T, s any, want bool) {
	t.Helper()
	d, ok := selfbound.Of(s)
	assert.Equal(t, want, ok, "%T promises a bound", s)
	assert.Zero(t, d, "%T's bound", s)
}
