package shmstore_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/sharedbucket"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/shmstore"
	"github.com/sluice-go/sluice/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func open(t *testing.T, dir string) *shmstore.Store {
	s, err := shmstore.Open(dir, sharedbucket.WithSlots(1024))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestShmConformance(t *testing.T) {
	dir := shmDir(t)
	storetest.Run(t, func(t *testing.T) store.Store { return open(t, dir) })
}

// Two stores on one directory (two mappings of each table, as two processes
// would have) hold one limit between them.
func TestShmTwoMappingsShareOneLimit(t *testing.T) {
	dir := shmDir(t)
	a, b := open(t, dir), open(t, dir)
	p := store.Policy{Rate: 1.0 / 3600, Burst: 50}
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for _, s := range []*shmstore.Store{a, b, a, b} {
		wg.Go(func() {
			for range 40 {
				r, err := s.Allow(context.Background(), "shared", 1, p)
				if assert.NoError(t, err) && r.Allowed {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	assert.Equal(t, int64(50), allowed.Load())
	files, err := filepath.Glob(filepath.Join(dir, "*"+sharedbucket.TableExt))
	require.NoError(t, err)
	assert.Len(t, files, 1, "one table file per policy")
	assert.Equal(t, "p-3600000000000ns-b50.sbt", filepath.Base(files[0]))
}

func TestShmReportsDenialFigures(t *testing.T) {
	s := open(t, shmDir(t))
	p := store.Policy{Rate: 10, Burst: 10}
	ctx := context.Background()
	for range 10 {
		r, err := s.Allow(ctx, "k", 1, p)
		require.NoError(t, err)
		require.True(t, r.Allowed)
	}
	r, err := s.Allow(ctx, "k", 1, p)
	require.NoError(t, err)
	require.False(t, r.Allowed)
	assert.Positive(t, r.RetryAfter)
	assert.LessOrEqual(t, r.RetryAfter, 100*time.Millisecond)
	assert.InDelta(t, time.Second, r.ResetAfter, float64(100*time.Millisecond))
}

func TestShmClosed(t *testing.T) {
	s, err := shmstore.Open(t.TempDir())
	require.NoError(t, err)
	require.NoError(t, s.Close())
	_, err = s.Allow(context.Background(), "k", 1, store.Policy{Rate: 1, Burst: 1})
	require.Error(t, err)
	require.Error(t, s.Ping(context.Background()))
}

func TestShmBadDir(t *testing.T) {
	f := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(f, nil, 0o600))
	_, err := shmstore.Open(filepath.Join(f, "sub"))
	require.Error(t, err)
}

func BenchmarkShmAllow(b *testing.B) {
	s, err := shmstore.Open(b.TempDir())
	require.NoError(b, err)
	defer s.Close()
	p := store.Policy{Rate: 1e6, Burst: 1000}
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			_, _ = s.Allow(context.Background(), keys[i&1023], 1, p)
			i++
		}
	})
}

func TestShmOnTmpfs(t *testing.T) {
	if st, err := os.Stat("/dev/shm"); err != nil || !st.IsDir() {
		t.Skip("no /dev/shm")
	}
	dir, err := os.MkdirTemp("/dev/shm", "shmstore-test-")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	s := open(t, dir)
	on, err := s.OnTmpfs()
	require.NoError(t, err)
	assert.True(t, on, "/dev/shm is tmpfs")
}

// shmDir returns a fresh directory on tmpfs (/dev/shm) when there is one,
// where shm tables belong (on a disk filesystem page writeback can stall
// them), else t.TempDir().
func shmDir(t *testing.T) string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "sluice-test-"); err == nil {
			t.Cleanup(func() { _ = os.RemoveAll(d) })
			return d
		}
	}
	return t.TempDir()
}

// TestShmEvictionsCounted: with more live keys than slots the table evicts
// (the limit loosens for the evicted keys); Evictions reports it per policy.
func TestShmEvictionsCounted(t *testing.T) {
	s, err := shmstore.Open(shmDir(t), sharedbucket.WithSlots(8))
	require.NoError(t, err)
	defer s.Close()
	p := store.Policy{Rate: 1.0 / 3600, Burst: 1}
	other := store.Policy{Rate: 1, Burst: 1}
	ev, co := s.Evictions(p)
	assert.Zero(t, ev+co, "no table yet")
	for i := range 20 {
		r, err := s.Allow(context.Background(), "k"+strconv.Itoa(i), 1, p)
		require.NoError(t, err)
		require.True(t, r.Allowed, "a new key is never denied")
	}
	ev, co = s.Evictions(p)
	assert.EqualValues(t, 12, ev, "20 live keys in 8 slots: 12 evictions")
	assert.Zero(t, co)
	ev, _ = s.Evictions(other)
	assert.Zero(t, ev, "counted per policy")
	assert.Equal(t, 8, s.Slots())
}

// TestShmDecisionFigures: the figures come with the decision (one probe):
// a denial's RetryAfter is exact, never patched to 1 ns.
func TestShmDecisionFigures(t *testing.T) {
	s := open(t, shmDir(t))
	p := store.Policy{Rate: 1.0 / 3600, Burst: 2}
	ctx := context.Background()
	r, err := s.Allow(ctx, "k", 2, p)
	require.NoError(t, err)
	assert.True(t, r.Allowed)
	assert.Zero(t, r.Remaining)
	assert.InDelta(t, 2*time.Hour, r.ResetAfter, float64(time.Second))
	r, err = s.Allow(ctx, "k", 1, p)
	require.NoError(t, err)
	assert.False(t, r.Allowed)
	assert.InDelta(t, time.Hour, r.RetryAfter, float64(time.Second))
	assert.InDelta(t, 2*time.Hour, r.ResetAfter, float64(time.Second))
}
