package leasegrpc_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/sluice-go/sluice/cmd/sluice/leasegrpc"
	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/lease"
	"github.com/sluice-go/sluice/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func serve(t *testing.T, clientNames ...string) lease.Transport {
	t.Helper()
	mem := store.NewMemory()
	p := store.Policy{Name: "api", Rate: 100, Burst: 50}
	srv, err := service.New(service.Config{Store: mem, Default: store.Policy{Rate: 1, Burst: 1},
		Limits: map[string]store.Policy{"api": p}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Leases: &service.LeaseConfig{NoLearning: true}, ClientNames: clientNames})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	leasegrpc.Register(g, srv.RenewLease)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(); g.Stop(); <-done; _ = mem.Close() })
	return leasegrpc.Transport(conn)
}

// A renewal over gRPC gets the same answer as over HTTP: a share of the
// policy, and refusals that keep their lease error.
func TestRenewOverGRPC(t *testing.T) {
	tr := serve(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := tr.Renew(ctx, &lease.Request{Holder: "r1", Keys: []lease.KeyRequest{
		{Policy: "api", Key: "tenant-a", Want: 30},
		{Policy: "nope", Key: "tenant-a", Want: 1},
	}})
	require.NoError(t, err)
	require.Len(t, resp.Keys, 2)
	g := resp.Keys[0]
	assert.Empty(t, g.Error)
	assert.InDelta(t, 30, g.Rate, 0.01, "its demand fits")
	assert.NotEmpty(t, g.Token)
	assert.Positive(t, g.ExpiresMS)
	assert.InDelta(t, 100, g.LimitRate, 0.01)
	assert.EqualValues(t, 50, g.LimitBurst)
	assert.Equal(t, "unknown_policy", resp.Keys[1].Error)
	assert.ErrorIs(t, lease.Err(resp.Keys[1].Error, ""), lease.ErrUnknownPolicy)

	_, err = tr.Renew(ctx, &lease.Request{Keys: []lease.KeyRequest{{Policy: "api", Key: "k"}}})
	require.Error(t, err, "no holder")
	assert.True(t, errors.Is(err, lease.ErrBadRequest), "%v", err)

	many := &lease.Request{Holder: "r2"}
	for i := range 1001 {
		many.Keys = append(many.Keys, lease.KeyRequest{Policy: "api", Key: strings.Repeat("k", 1+i%7) + string(rune('a'+i%26)) + string(rune('a'+i/26%26)) + string(rune('a'+i/676))})
	}
	_, err = tr.Renew(ctx, many)
	require.Error(t, err)
	assert.ErrorIs(t, err, lease.ErrTooManyKeys)
}

// With -client-names, a caller without a named client certificate (here:
// no TLS at all) gets PermissionDenied and no lease.
func TestRenewRefusesUnnamedClients(t *testing.T) {
	tr := serve(t, "replica-1")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := tr.Renew(ctx, &lease.Request{Holder: "r1", Keys: []lease.KeyRequest{{Policy: "api", Key: "k", Want: 1}}})
	require.Error(t, err)
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
}
