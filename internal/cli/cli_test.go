package cli_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/cli"
	"github.com/sluice-go/sluice/service"
	"github.com/sluice-go/sluice/service/store"
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
