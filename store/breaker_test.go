package store_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/storetest"
)

// flaky is a memory store that fails every call while down, counting the
// calls that reach it.
type flaky struct {
	store.Store
	mu          sync.Mutex
	down        bool
	allow, ping int
}

var errRefused = errors.New("connection refused")

func (f *flaky) set(down bool) { f.mu.Lock(); f.down = down; f.mu.Unlock() }
func (f *flaky) calls() (allow, ping int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.allow, f.ping
}
func (f *flaky) Allow(ctx context.Context, k string, n int64, p store.Policy) (store.Result, error) {
	f.mu.Lock()
	f.allow++
	down := f.down
	f.mu.Unlock()
	if down {
		return store.Result{}, errRefused
	}
	if err := ctx.Err(); err != nil {
		return store.Result{}, err
	}
	return f.Store.Allow(ctx, k, n, p)
}
func (f *flaky) Ping(ctx context.Context) error {
	f.mu.Lock()
	f.ping++
	down := f.down
	f.mu.Unlock()
	if down {
		return errRefused
	}
	return f.Store.Ping(ctx)
}

func TestBreakerConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		b := store.NewBreaker(store.NewMemory(), store.BreakerOptions{})
		t.Cleanup(func() { require.NoError(t, b.Close()) })
		return b
	})
}

func TestBreakerOpensProbesAndCloses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &flaky{Store: store.NewMemory()}
		b := store.NewBreaker(f, store.BreakerOptions{Trip: 3, ProbeEvery: 200 * time.Millisecond})
		defer b.Close()
		ctx := context.Background()
		p := store.Policy{Rate: 10, Burst: 10}

		_, err := b.Allow(ctx, "k", 1, p)
		require.NoError(t, err)
		require.NoError(t, b.Fault())

		f.set(true)
		for range 3 {
			_, err = b.Allow(ctx, "k", 1, p)
			require.ErrorIs(t, err, errRefused)
			require.NotErrorIs(t, err, store.ErrDown, "still closed: the store was asked")
		}
		allows, _ := f.calls()
		_, err = b.Allow(ctx, "k", 1, p)
		require.ErrorIs(t, err, store.ErrDown, "open after 3 failures in a row")
		require.ErrorIs(t, err, errRefused, "naming the cause")
		assert.ErrorContains(t, b.Ping(ctx), "store down (memory): connection refused")
		_, err = b.Keys(ctx)
		assert.ErrorIs(t, err, store.ErrDown)
		again, pings := f.calls()
		assert.Equal(t, allows, again, "an open breaker does not call the store")
		assert.Zero(t, pings)

		// Probes every 200 ms while the store stays down.
		time.Sleep(time.Second)
		synctest.Wait()
		_, pings = f.calls()
		assert.Equal(t, 5, pings)
		require.Error(t, b.Fault())

		// Back: the next probe closes the breaker.
		f.set(false)
		time.Sleep(200 * time.Millisecond)
		synctest.Wait()
		require.NoError(t, b.Fault(), "closed within one probe")
		r, err := b.Allow(ctx, "k", 1, p)
		require.NoError(t, err)
		assert.True(t, r.Allowed)
		_, pings = f.calls()
		time.Sleep(time.Second)
		synctest.Wait()
		_, after := f.calls()
		assert.Equal(t, pings, after, "no probes while closed")
	})
}

// A success between failures resets the count; cancelled callers and bad
// requests do not count.
func TestBreakerCountsOnlyStoreFailuresInARow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &flaky{Store: store.NewMemory()}
		b := store.NewBreaker(f, store.BreakerOptions{Trip: 2})
		defer b.Close()
		p := store.Policy{Rate: 10, Burst: 10}
		cancelled, cancel := context.WithCancel(context.Background())
		cancel()
		for range 5 {
			_, err := b.Allow(cancelled, "k", 1, p)
			require.ErrorIs(t, err, context.Canceled)
			_, err = b.Allow(context.Background(), "k", 11, p)
			require.ErrorIs(t, err, store.ErrCostExceedsBurst)
		}
		for range 5 {
			f.set(true)
			_, err := b.Allow(context.Background(), "k", 1, p)
			require.ErrorIs(t, err, errRefused)
			f.set(false)
			_, err = b.Allow(context.Background(), "k", 1, p)
			require.NoError(t, err)
		}
		require.NoError(t, b.Fault())
	})
}

// Close while open stops the probe (goleak checks) and closes the store.
func TestBreakerCloseWhileOpen(t *testing.T) {
	f := &flaky{Store: store.NewMemory()}
	b := store.NewBreaker(f, store.BreakerOptions{Trip: 1, ProbeEvery: time.Hour})
	f.set(true)
	_, err := b.Allow(context.Background(), "k", 1, store.Policy{Rate: 1, Burst: 1})
	require.Error(t, err)
	require.ErrorIs(t, b.Fault(), store.ErrDown)
	require.NoError(t, b.Close())
	_, err = f.Store.Allow(context.Background(), "k", 1, store.Policy{Rate: 1, Burst: 1})
	assert.ErrorIs(t, err, store.ErrClosed)
}
