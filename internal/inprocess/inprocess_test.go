package inprocess_test

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/inprocess"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/shmstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestStoresAreMarked: the memory and shm stores are in-process; a store
// that wraps one (the breaker, which may hand a call to any store) is not,
// and neither is anything else.
func TestStoresAreMarked(t *testing.T) {
	mem := store.NewMemory()
	t.Cleanup(func() { _ = mem.Close() })
	assert.True(t, inprocess.Is(mem))
	if runtime.GOOS == "linux" || runtime.GOOS == "darwin" {
		shm, err := shmstore.Open(t.TempDir())
		require.NoError(t, err)
		t.Cleanup(func() { _ = shm.Close() })
		assert.True(t, inprocess.Is(shm))
	}
	br := store.NewBreaker(mem, store.BreakerOptions{})
	t.Cleanup(func() { _ = br.Close() })
	assert.False(t, inprocess.Is(br))
	assert.False(t, inprocess.Is(nil))
	assert.False(t, inprocess.Is(struct{}{}))
}
