package client_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/client"
	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/store"
)

// TestStore: the service seen as a store.Store gives the service's
// decisions with the figures a store gives (ResetAfter derived from the
// bucket), cached denials included.
func TestStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newClient(t, &inProcess{h: newService(t, "k=10:2")}).Store()
		ctx := context.Background()
		p := store.Policy{Name: "k", Rate: 10, Burst: 2}
		r, err := st.Allow(ctx, "k", 1, p)
		require.NoError(t, err)
		assert.Equal(t, store.Result{Allowed: true, Remaining: 1, ResetAfter: 100 * time.Millisecond}, r)
		r, err = st.Allow(ctx, "k", 1, p)
		require.NoError(t, err)
		assert.Equal(t, store.Result{Allowed: true, Remaining: 0, ResetAfter: 200 * time.Millisecond}, r)
		r, err = st.Allow(ctx, "k", 1, p)
		require.NoError(t, err)
		assert.Equal(t, store.Result{Allowed: false, Remaining: 0, RetryAfter: 100 * time.Millisecond, ResetAfter: 200 * time.Millisecond}, r)
		time.Sleep(30 * time.Millisecond)
		r, err = st.Allow(ctx, "k", 1, p) // from the deny cache
		require.NoError(t, err)
		assert.False(t, r.Allowed)
		assert.Equal(t, 70*time.Millisecond, r.RetryAfter)

		_, err = st.Allow(ctx, "k", 3, p)
		assert.ErrorIs(t, err, store.ErrCostExceedsBurst)
		n, err := st.Keys(ctx)
		require.NoError(t, err)
		assert.EqualValues(t, 1, n)
		require.NoError(t, st.Ping(ctx))
		assert.Equal(t, "service", st.Name())
		require.NoError(t, st.Close())
		_, err = st.Allow(ctx, "k", 1, p)
		assert.ErrorIs(t, err, store.ErrClosed)
		assert.ErrorIs(t, st.Ping(ctx), store.ErrClosed)
	})
}

// downStore is a store that always fails.
type downStore struct{ store.Store }

func (downStore) Allow(context.Context, string, int64, store.Policy) (store.Result, error) {
	return store.Result{}, errors.New("connection refused")
}
func (downStore) Ping(context.Context) error { return errors.New("connection refused") }

// TestStoreDegraded: a service answering without its own store (its fail
// mode) is an unavailable store to the caller, whose own fail mode applies.
func TestStoreDegraded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := store.NewMemory()
		defer mem.Close()
		for _, open := range []bool{true, false} {
			srv, err := service.New(service.Config{Store: downStore{mem}, Default: store.Policy{Rate: 10, Burst: 10},
				FailOpen: open, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			require.NoError(t, err)
			st := newClient(t, &inProcess{h: srv}).Store()
			_, err = st.Allow(context.Background(), "k", 1, store.Policy{Rate: 10, Burst: 10})
			assert.ErrorIs(t, err, client.ErrUnavailable, "fail open=%v", open)
			assert.ErrorContains(t, err, "store unavailable")
			assert.ErrorIs(t, st.Ping(context.Background()), client.ErrUnavailable)
		}
	})
}
