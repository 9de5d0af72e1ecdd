package shmstore_test

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/sharedbucket"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/shmstore"
)

func names(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*"+sharedbucket.TableExt))
	require.NoError(t, err)
	out := make([]string, len(files))
	for i, f := range files {
		out[i] = filepath.Base(f)
	}
	sort.Strings(out)
	return out
}

// Open removes the table files nobody holds whose buckets are all full (of
// any slot count), and keeps those with debt, those another Store holds, and
// those it cannot judge (another program's names).
func TestShmOpenSweepsIdleTables(t *testing.T) {
	dir := shmDir(t)
	ctx := context.Background()
	debt := store.Policy{Rate: 1.0 / 3600, Burst: 5} // one spend: an hour of debt
	idle := store.Policy{Rate: 1e6, Burst: 1}        // full again within a microsecond
	held := store.Policy{Rate: 1.0 / 3600, Burst: 2} // open elsewhere, never spent
	other := store.Policy{Rate: 1e6, Burst: 3}       // another slot count

	a, err := shmstore.Open(dir, sharedbucket.WithSlots(1024))
	require.NoError(t, err)
	for _, p := range []store.Policy{debt, idle} {
		_, err := a.Allow(ctx, "k", 1, p)
		require.NoError(t, err)
	}
	c := open(t, dir)
	require.NoError(t, c.Prepare(held))
	d, err := shmstore.Open(dir, sharedbucket.WithSlots(2048))
	require.NoError(t, err)
	require.NoError(t, d.Prepare(other))
	require.NoError(t, d.Close())
	require.NoError(t, os.WriteFile(filepath.Join(dir, "api"+sharedbucket.TableExt), []byte("not ours"), 0o600))
	require.NoError(t, a.Close())
	require.Equal(t, []string{"api.sbt", "p-1000ns-b1.sbt", "p-1000ns-b3.sbt", "p-3600000000000ns-b2.sbt", "p-3600000000000ns-b5.sbt"}, names(t, dir))

	b := open(t, dir)
	assert.Equal(t, []string{"api.sbt", "p-3600000000000ns-b2.sbt", "p-3600000000000ns-b5.sbt"}, names(t, dir),
		"the idle, unheld tables are gone, whatever their slot count")

	// The held table is the one b opens: one limit between them.
	for range 2 {
		r, err := b.Allow(ctx, "k", 1, held)
		require.NoError(t, err)
		require.True(t, r.Allowed)
	}
	r, err := c.Allow(ctx, "k", 1, held)
	require.NoError(t, err)
	assert.False(t, r.Allowed, "b and c share the held table")
	r, err = b.Allow(ctx, "k", 1, debt)
	require.NoError(t, err)
	assert.InDelta(t, 3, r.Remaining, 0.01, "the debt survived")
}

// A restart with more slots (what the eviction warning advises) replaces the
// tables of the old slot count that nobody holds and whose buckets are all
// full; one with debt stays, and opening it with the new count fails with
// ErrPolicyMismatch and an error that says what to do.
func TestShmMoreSlotsAfterRestart(t *testing.T) {
	dir := shmDir(t)
	ctx := context.Background()
	idle := store.Policy{Rate: 1e6, Burst: 3}        // full again within a microsecond
	debt := store.Policy{Rate: 1.0 / 3600, Burst: 5} // one spend: an hour of debt
	a, err := shmstore.Open(dir, sharedbucket.WithSlots(1024))
	require.NoError(t, err)
	require.NoError(t, a.Prepare(idle))
	_, err = a.Allow(ctx, "k", 1, debt)
	require.NoError(t, err)
	require.NoError(t, a.Close())

	b, err := shmstore.Open(dir, sharedbucket.WithSlots(2048))
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	require.NoError(t, b.Prepare(idle), "the idle table of 1024 slots was replaced")
	assert.Equal(t, 2048, b.Slots())
	err = b.Prepare(debt)
	require.ErrorIs(t, err, sharedbucket.ErrPolicyMismatch)
	assert.ErrorContains(t, err, "p-3600000000000ns-b5.sbt")
	assert.ErrorContains(t, err, "still owes")
}

// Stores opening new tables while others sweep never end up on two files
// for one policy: each round's stores share one limit.
func TestShmSweepRacesOpen(t *testing.T) {
	dir := shmDir(t)
	ctx := context.Background()
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		for !stop.Load() {
			s, err := shmstore.Open(dir, sharedbucket.WithSlots(1024))
			if assert.NoError(t, err) {
				_ = s.Close()
			}
		}
	})
	for round := range 40 {
		p := store.Policy{Rate: 1.0 / 3600, Burst: int64(2 + round)}
		x, y := open(t, dir), open(t, dir)
		var ready sync.WaitGroup
		for _, s := range []*shmstore.Store{x, y} {
			ready.Go(func() { assert.NoError(t, s.Prepare(p)) })
		}
		ready.Wait()
		allowed := 0
		for i := range 2 * p.Burst {
			s := []*shmstore.Store{x, y}[i%2]
			r, err := s.Allow(ctx, "k", 1, p)
			require.NoError(t, err)
			if r.Allowed {
				allowed++
			}
		}
		require.EqualValues(t, p.Burst, allowed, "round %d: two stores, one limit", round)
	}
	stop.Store(true)
	wg.Wait()
}
