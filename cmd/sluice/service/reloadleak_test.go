package service_test

import (
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/sharedbucket"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/shmstore"
)

// changingRules is a 50-rule file for the HTTP domain whose every limit and
// half of whose names change with gen: a reload of it drops every policy
// the previous one had.
func changingRules(gen int) string {
	units := []string{"second", "minute", "hour"}
	var b strings.Builder
	b.WriteString("domain: http\ndescriptors:\n")
	for i := range 50 {
		name := ""
		if i%2 == 0 {
			name = fmt.Sprintf("name: r%d-g%d, ", i, gen)
		}
		fmt.Fprintf(&b, "  - key: key\n    value: k%d\n    rate_limit: {%sunit: %s, requests_per_unit: %d}\n",
			i, name, units[(i+gen)%len(units)], 100+i*50+gen)
	}
	return b.String()
}

// openFDs counts this process's open file descriptors (Linux), or -1.
func openFDs(t *testing.T) int {
	if runtime.GOOS != "linux" {
		return -1
	}
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// series counts the per-policy decision series in reg.
func series(t *testing.T, reg *prometheus.Registry) int {
	mfs, err := reg.Gather()
	require.NoError(t, err)
	n := 0
	for _, mf := range mfs {
		switch mf.GetName() {
		case "sluice_decisions_total", "sluice_fail_open_decisions_total":
			n += len(mf.GetMetric())
		}
	}
	return n
}

// TestReloadReleasesWhatItDrops: 40 reloads of a 50-rule file whose limits
// and names all change, each followed by a decision on every rule, leave as
// many shm table files, open descriptors and metric series as the first
// did: a reload closes the tables it drops (removing their files, which no
// other process holds) and deletes the series of the policies it drops.
func TestReloadReleasesWhatItDrops(t *testing.T) {
	dir, err := os.MkdirTemp("", "sluice-reload-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	st, err := shmstore.Open(dir, sharedbucket.WithSlots(64))
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	path := filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(path, []byte(changingRules(0)), 0o600))
	reg := service.NewRegistry()
	srv, err := service.New(service.Config{Store: st, Default: store.Policy{Rate: 10, Burst: 10}, Registry: reg,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)

	decideAll := func() {
		for i := range 50 {
			w := httptest.NewRecorder()
			srv.ServeHTTP(w, httptest.NewRequest("GET", fmt.Sprintf("/allow?key=k%d", i), nil))
			require.Equal(t, 200, w.Code, "%s", w.Body)
		}
	}
	tables := func() int {
		m, err := filepath.Glob(filepath.Join(dir, "*"+sharedbucket.TableExt))
		require.NoError(t, err)
		return len(m)
	}
	var files0, fds0, series0 int
	for gen := range 40 {
		require.NoError(t, os.WriteFile(path, []byte(changingRules(gen)), 0o600))
		require.NoError(t, srv.ReloadRules(path))
		decideAll()
		if gen == 0 {
			files0, fds0, series0 = tables(), openFDs(t), series(t, reg)
			require.Greater(t, files0, 40, "a table per rule's limit")
			require.Greater(t, series0, 50*6, "six series per rule")
			continue
		}
		require.LessOrEqual(t, tables(), files0+5, "table files after reload %d", gen)
		require.LessOrEqual(t, openFDs(t), fds0+5, "open descriptors after reload %d", gen)
		require.LessOrEqual(t, series(t, reg), series0, "metric series after reload %d", gen)
	}
	// Dropping every rule leaves the default policy's table alone.
	require.NoError(t, srv.SetRules(nil))
	assert.Equal(t, 1, tables(), "the default policy's table")
}
