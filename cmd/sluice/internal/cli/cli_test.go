package cli_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/client"
	"github.com/sluice-go/sluice/cmd/sluice/internal/cli"
	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestMainUsage(t *testing.T) {
	var out, errb bytes.Buffer
	assert.Equal(t, 2, cli.Main(context.Background(), nil, &out, &errb))
	assert.Contains(t, errb.String(), "usage: sluice")
	errb.Reset()
	assert.Equal(t, 2, cli.Main(context.Background(), []string{"frobnicate"}, &out, &errb))
	assert.Contains(t, errb.String(), `unknown command "frobnicate"`)
	assert.Equal(t, 0, cli.Main(context.Background(), []string{"help"}, &out, &errb))
	for _, args := range [][]string{
		{"serve", "-limits", "x"}, {"serve", "-burst", "0"}, {"serve", "extra"}, {"serve", "-log", "xml"},
		{"client", "-fail", "sometimes"}, {"client", "-rps", "0"}, {"client", "-limiter", "nope"},
		{"demo", "-replicas", "0"},
	} {
		errb.Reset()
		assert.Equal(t, 2, cli.Main(context.Background(), args, &out, &errb), "%v: %s", args, errb.String())
		assert.NotEmpty(t, errb.String(), "%v names the problem", args)
	}
}

func TestCheckStoreSpec(t *testing.T) {
	for _, ok := range []string{"memory", "shm", "shm:/tmp/x", "redis://127.0.0.1:6379/0", "rediss://h:1/2", "rediscluster://h:1?addr=h:2"} {
		assert.NoError(t, cli.CheckStoreSpec(ok), ok)
	}
	for _, bad := range []string{"", "shm:", "mem", "redis:/x", "http://x"} {
		assert.Error(t, cli.CheckStoreSpec(bad), bad)
	}
}

// RunServer serves until ctx is cancelled and then shuts down gracefully,
// letting an in-flight request finish.
func TestRunServerGracefulShutdown(t *testing.T) {
	mem := store.NewMemory()
	defer mem.Close()
	ctx, cancel := context.WithCancel(context.Background())
	addrc := make(chan net.Addr, 1)
	errc := make(chan error, 1)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := service.Config{Store: mem, Default: store.Policy{Rate: 10, Burst: 10}, Logger: quiet}
	go func() { errc <- cli.RunServer(ctx, cfg, "127.0.0.1:0", quiet, func(a net.Addr) { addrc <- a }) }()
	addr := <-addrc
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	resp, err := c.Get("http://" + addr.String() + "/allow?key=k")
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)
	cancel()
	require.NoError(t, <-errc)
	_, err = c.Get("http://" + addr.String() + "/healthz")
	assert.Error(t, err, "the listener is closed after shutdown")
}

func TestVersion(t *testing.T) {
	for _, arg := range []string{"version", "-version", "--version"} {
		var out, errb bytes.Buffer
		require.Equal(t, 0, cli.Main(context.Background(), []string{arg}, &out, &errb), arg)
		assert.Regexp(t, `^sluice \S+ .*go1\.\d+.* \w+/\w+\n$`, out.String(), arg)
		assert.Equal(t, cli.Version()+"\n", out.String())
	}
}

// The client waits longer than the server waits for its store, so a slow
// store reaches the client as the server's answer per -fail, not as a
// client timeout.
func TestClientTimeoutExceedsStoreTimeout(t *testing.T) {
	assert.Greater(t, client.DefaultTimeout, service.DefaultStoreTimeout)
}

// demo -plot with a format it cannot draw is refused before the demo runs
// (a -duration of an hour would otherwise hold the test), and leaves no file.
func TestDemoPlotRefusesFormatFirst(t *testing.T) {
	file := filepath.Join(t.TempDir(), "x.gif")
	var out, errb bytes.Buffer
	require.Equal(t, 2, cli.Main(context.Background(), []string{"demo", "-duration", "1h", "-plot", file}, &out, &errb))
	assert.Contains(t, errb.String(), ".svg, .png or .pdf")
	assert.Empty(t, out.String())
	_, err := os.Stat(file)
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// version -h prints the command's usage, not the version.
func TestVersionHelp(t *testing.T) {
	var out, errb bytes.Buffer
	require.Equal(t, 0, cli.Main(context.Background(), []string{"version", "-h"}, &out, &errb))
	assert.Contains(t, errb.String(), "usage: sluice version")
	assert.Empty(t, out.String())
	require.Equal(t, 2, cli.Main(context.Background(), []string{"version", "extra"}, &out, &errb))
	require.Equal(t, 0, cli.Main(context.Background(), []string{"version"}, &out, &errb))
	assert.Contains(t, out.String(), "sluice ")
}

// demo -plot draws the replicas and the limit line to an SVG file.
func TestDemoPlot(t *testing.T) {
	file := filepath.Join(t.TempDir(), "demo.svg")
	var out, errb bytes.Buffer
	require.Equal(t, 0, cli.Main(context.Background(), []string{"demo", "-duration", "1s", "-plot", file}, &out, &errb), errb.String())
	assert.Contains(t, out.String(), "plot written to "+file)
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	svg := string(b)
	assert.Contains(t, svg, "<svg")
	for _, label := range []string{"the limit: 10/s × t + 10", "inst-1", "inst-2", "inst-3", "all replicas"} {
		assert.Contains(t, svg, label)
	}
}

type downStore struct{ store.Store }

func (downStore) Allow(context.Context, string, int64, store.Policy) (store.Result, error) {
	return store.Result{}, errors.New("connection refused")
}

// A replica counts the service's answers per -fail as degraded, not as the
// limit's denials.
func TestReplicaCountsDegraded(t *testing.T) {
	mem := store.NewMemory()
	defer mem.Close()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := service.New(service.Config{Store: downStore{mem}, Default: store.Policy{Rate: 10, Burst: 10}, Fail: store.FailOpen, Logger: quiet})
	require.NoError(t, err)
	ts := httptest.NewServer(srv)
	defer ts.Close()
	c, err := client.New(ts.URL, client.WithoutDenyCache())
	require.NoError(t, err)
	defer c.Close()
	r := cli.Replica{ID: "inst-1", Client: c, Key: "k", RPS: 1000, Duration: 50 * time.Millisecond}
	st := r.Run(context.Background(), nil)
	require.Positive(t, st.Attempts)
	assert.Equal(t, st.Attempts, st.Degraded)
	assert.Zero(t, st.Denied)
	assert.Equal(t, st.Attempts, st.WorkDone, "fail open")
	assert.Contains(t, st.Summary(), fmt.Sprintf("denied=0 degraded=%d → work done=%d", st.Attempts, st.Attempts))
}
