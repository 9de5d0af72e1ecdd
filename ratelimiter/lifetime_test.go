package ratelimiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/ratelimiter"
	"github.com/sluice-go/sluice/sched"
)

type ctxKey struct{}

// TestWrappedLoopCtxStopsWithRun: a limiter made with a loop's ctx under a
// wrapper (WithValue, WithCancel) still belongs to that loop and stops when
// the run ends. It was still Running after Run returned.
func TestWrappedLoopCtxStopsWithRun(t *testing.T) {
	var l *ratelimiter.Limiter
	run(t, func(ctx context.Context) error {
		wrapped, cancel := context.WithCancel(context.WithValue(ctx, ctxKey{}, "v"))
		defer cancel()
		var err error
		l, err = ratelimiter.New(wrapped, 10, 1)
		require.NoError(t, err)
		assert.True(t, l.Running())
		return nil
	})
	assert.False(t, l.Running())
	assert.ErrorIs(t, l.Acquire(context.Background(), 1), ratelimiter.ErrStopped)
}

// TestRequestCtxDoesNotStopLimiter: New's ctx chooses the time domain only.
// A request ctx passed to New (an easy mistake) must not stop the limiter
// for good when the request ends.
func TestRequestCtxDoesNotStopLimiter(t *testing.T) {
	req, cancel := context.WithCancel(context.Background())
	l, err := ratelimiter.New(req, 1e6, 1)
	require.NoError(t, err)
	cancel()
	assert.True(t, l.Running())
	require.NoError(t, l.Acquire(context.Background(), 1))
	assert.True(t, l.Stop())
	assert.ErrorIs(t, l.Acquire(context.Background(), 1), ratelimiter.ErrStopped)

	// Inside a loop, a ctx of one fiber's request that ends early does not
	// stop it either; the end of the run does.
	var inLoop *ratelimiter.Limiter
	run(t, func(ctx context.Context) error {
		req, cancel := sched.WithTimeout(ctx, time.Second)
		inLoop, err = ratelimiter.New(req, 10, 1)
		require.NoError(t, err)
		cancel()
		assert.True(t, inLoop.Running())
		return inLoop.Acquire(ctx, 2)
	})
	assert.False(t, inLoop.Running())
}
