package clientcheck_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/client"
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

// TestStorePolicyMismatch: the service decides with its own policy for a
// key; a caller asking with another one gets an error naming both, not a
// decision made under a limit it did not ask for.
func TestStorePolicyMismatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newClient(t, &inProcess{h: newService(t, "k=10:2")}).Store()
		ctx := context.Background()
		for _, p := range []store.Policy{{Name: "k", Rate: 2, Burst: 2}, {Name: "k", Rate: 10, Burst: 5}} {
			_, err := st.Allow(ctx, "k", 1, p)
			require.ErrorIs(t, err, client.ErrPolicyMismatch)
			assert.ErrorContains(t, err, "rate 10 burst 2")
			assert.ErrorContains(t, err, fmt.Sprintf("rate %v burst %d", p.Rate, p.Burst))
		}
		r, err := st.Allow(ctx, "k", 1, store.Policy{Name: "k", Rate: 10, Burst: 2})
		require.NoError(t, err)
		assert.False(t, r.Allowed, "the service counted the two calls it answered under its own policy")
		time.Sleep(100 * time.Millisecond)
		r, err = st.Allow(ctx, "k", 1, store.Policy{Name: "k", Rate: 10, Burst: 2})
		require.NoError(t, err)
		assert.True(t, r.Allowed)
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
	failMode := map[bool]store.FailMode{true: store.FailOpen, false: store.FailClosed}
	synctest.Test(t, func(t *testing.T) {
		mem := store.NewMemory()
		defer mem.Close()
		for _, open := range []bool{true, false} {
			srv, err := service.New(service.Config{Store: downStore{mem}, Default: store.Policy{Rate: 10, Burst: 10},
				Fail: failMode[open], Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			require.NoError(t, err)
			st := newClient(t, &inProcess{h: srv}).Store()
			_, err = st.Allow(context.Background(), "k", 1, store.Policy{Rate: 10, Burst: 10})
			assert.ErrorIs(t, err, client.ErrUnavailable, "fail open=%v", open)
			assert.ErrorContains(t, err, "store unavailable")
			assert.ErrorIs(t, st.Ping(context.Background()), client.ErrUnavailable)
		}
	})
}

// A reply whose "remaining" is negative (no service sends one: a bucket
// never holds less than nothing) is unusable, not turned into a reset time:
// (limit − remaining)/rate of -1e300 passed any Duration and the
// conversion wrapped it.
func TestStoreNegativeRemaining(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, `{"allowed":true,"remaining":-1e300,"limit":10,"rate":10}`)
		})
		st := newClient(t, &inProcess{h: h}).Store()
		r, err := st.Allow(context.Background(), "k", 1, store.Policy{Name: "k", Rate: 10, Burst: 10})
		require.ErrorIs(t, err, client.ErrUnavailable, "got %+v", r)
		assert.ErrorContains(t, err, "remaining")
	})
}
