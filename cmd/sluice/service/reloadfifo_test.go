//go:build unix

package service_test

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
	"github.com/sluice-go/sluice/store"
)

// A rules file swapped for a named pipe makes the next reload fail at once
// (ErrNotRegular), keeping the rules in force, and the reload after it,
// from a regular file again, works. A reload whose context has ended gives
// up at once and keeps the rules too.
func TestReloadRefusesNamedPipeAndEnds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	write := func(rpu string) {
		require.NoError(t, os.WriteFile(path, []byte("domain: http\ndescriptors:\n  - key: key\n    rate_limit: {unit: minute, requests_per_unit: "+rpu+"}\n"), 0o600))
	}
	write("3")
	mem := store.NewMemory()
	t.Cleanup(func() { _ = mem.Close() })
	srv, err := service.New(service.Config{Store: mem, Default: store.Policy{Rate: 10, Burst: 10},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	limit := func() string {
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, httptest.NewRequest("GET", "/allow?key=a", nil))
		return w.Header().Get("X-RateLimit-Limit")
	}
	require.NoError(t, srv.ReloadRules(path))
	require.Equal(t, "3", limit())

	require.NoError(t, os.Remove(path))
	require.NoError(t, syscall.Mkfifo(path, 0o600))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- srv.ReloadRulesContext(ctx, path) }()
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		w, _ := os.OpenFile(path, os.O_WRONLY, 0) // let the blocked open go
		_ = w.Close()
		<-done
		t.Fatal("a reload blocked on a named pipe")
	}
	require.ErrorIs(t, err, rules.ErrNotRegular)
	assert.Equal(t, "3", limit(), "the rules in force stay")

	require.NoError(t, os.Remove(path))
	write("5")
	canceled, cancel2 := context.WithCancel(context.Background())
	cancel2()
	require.ErrorIs(t, srv.ReloadRulesContext(canceled, path), context.Canceled)
	assert.Equal(t, "3", limit(), "a reload given up keeps the rules in force")
	require.NoError(t, srv.ReloadRulesContext(ctx, path))
	assert.Equal(t, "5", limit())
}
