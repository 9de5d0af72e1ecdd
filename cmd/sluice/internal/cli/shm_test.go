package cli

import (
	"bytes"
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/sharedbucket"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/shmstore"
)

// TestEvictionWarning: serve warns when a shm table starts evicting, names
// -shm-slots, and does not repeat itself more than once per
// evictionWarnEvery per policy.
func TestEvictionWarning(t *testing.T) {
	st, err := shmstore.Open(t.TempDir(), sharedbucket.WithSlots(8))
	require.NoError(t, err)
	defer st.Close()
	p := store.Policy{Name: "default", Rate: 1.0 / 3600, Burst: 1}
	require.NoError(t, st.Prepare(p))
	var logs bytes.Buffer
	w := newEvictionWarner(st, []store.Policy{p}, slog.New(slog.NewTextHandler(&logs, nil)))
	spend := func(from, to int) {
		for i := from; i < to; i++ {
			_, err := st.Allow(context.Background(), "k"+strconv.Itoa(i), 1, p)
			require.NoError(t, err)
		}
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	spend(0, 8) // fills the slots: no eviction yet
	w.check(t0)
	assert.Empty(t, logs.String())

	spend(8, 12) // 4 evictions
	w.check(t0.Add(evictionCheckEvery))
	assert.Equal(t, 1, strings.Count(logs.String(), "level=WARN"))
	assert.Contains(t, logs.String(), "-shm-slots")
	assert.Contains(t, logs.String(), "evicted=4")
	assert.Contains(t, logs.String(), "shm_slots=8")

	spend(12, 20)
	w.check(t0.Add(2 * evictionCheckEvery))
	assert.Equal(t, 1, strings.Count(logs.String(), "level=WARN"), "rate-limited")
	spend(20, 22)
	w.check(t0.Add(evictionCheckEvery + evictionWarnEvery))
	assert.Equal(t, 2, strings.Count(logs.String(), "level=WARN"), "warns again after evictionWarnEvery")
	w.check(t0.Add(evictionCheckEvery + 3*evictionWarnEvery))
	assert.Equal(t, 2, strings.Count(logs.String(), "level=WARN"), "no new evictions, no warning")

	stop := startEvictionWarner(context.Background(), st, []store.Policy{p}, slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
	stop() // returns once the goroutine has ended (goleak checks)
}
