package service_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/sharedbucket"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/shmstore"
)

// TestEvictionsVisible: with more live keys than slots the shm table
// evicts, which loosens the limit; /metrics and /stats show it per policy.
func TestEvictionsVisible(t *testing.T) {
	dir, err := os.MkdirTemp("", "sluice-evict-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	st, err := shmstore.Open(dir, sharedbucket.WithSlots(8))
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	limits, err := service.ParseLimits("vip=100:100")
	require.NoError(t, err)
	srv, err := service.New(service.Config{Store: st, Default: store.Policy{Rate: 1.0 / 3600, Burst: 1},
		Limits: limits, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)

	for i := range 20 {
		resp, err := ts.Client().Get(ts.URL + "/allow?key=k" + strconv.Itoa(i))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode, "a new key is never denied, even when it evicts")
	}
	resp, err := ts.Client().Get(ts.URL + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(body), `sluice_evictions_total{policy="default"} 12`)
	assert.Contains(t, string(body), `sluice_contended_total{policy="default"} 0`)
	assert.Contains(t, string(body), `sluice_evictions_total{policy="vip"} 0`)

	resp, err = ts.Client().Get(ts.URL + "/stats")
	require.NoError(t, err)
	var stats struct {
		Policies map[string]service.PolicyEvictions `json:"policies"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&stats))
	resp.Body.Close()
	assert.Equal(t, service.PolicyEvictions{Evicted: 12}, stats.Policies["default"])
	assert.Contains(t, stats.Policies, "vip")
}

// TestTableSeriesOnlyForTableStores: a store that reports neither
// evictions nor slot health (memory) gets none of their series, while the
// shm store above gets both families from one collector.
func TestTableSeriesOnlyForTableStores(t *testing.T) {
	mem := store.NewMemory()
	t.Cleanup(func() { mem.Close() })
	srv, err := service.New(service.Config{Store: mem, Default: store.Policy{Rate: 1, Burst: 1},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	resp, err := ts.Client().Get(ts.URL + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(body), "sluice_decisions_total", "the registry is served")
	for _, name := range []string{"sluice_evictions_total", "sluice_contended_total", "sluice_locked_slots",
		"sluice_recovered_locks_total", "sluice_corrupt_words_total"} {
		assert.NotContains(t, string(body), name)
	}
}
