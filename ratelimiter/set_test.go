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

// TestSetRateRetimesWaiters: SetRate on a live limiter re-times a parked
// waiter at once, keeping the fraction accrued at the old rate.
func TestSetRateRetimesWaiters(t *testing.T) {
	ms := time.Millisecond
	run(t, func(ctx context.Context) error {
		l := newLimiter(t, ctx, 10, 1)
		require.True(t, l.TryAcquire(1))
		var at time.Duration
		f := sched.Go(ctx, func(ctx context.Context) error {
			err := l.Acquire(ctx, 1) // due at +100ms at 10/s
			at = since(ctx)
			return err
		})
		require.NoError(t, sched.Sleep(ctx, 50*ms))
		// Half a token has accrued; at 1/s the other half takes 500ms.
		require.NoError(t, l.SetRate(1))
		assert.Equal(t, 1.0, l.Rate())
		require.NoError(t, f.Wait(ctx))
		assert.Equal(t, 550*ms, at)
		// Faster again: the next token comes 1/100 s later.
		require.NoError(t, l.SetRate(100))
		require.NoError(t, l.Acquire(ctx, 1))
		assert.Equal(t, 560*ms, since(ctx))
		return nil
	})
}

// TestSetBurst: a larger burst lets the bucket fill further, a smaller one
// caps it at once; bad values are errors naming them.
func TestSetBurst(t *testing.T) {
	run(t, func(ctx context.Context) error {
		l := newLimiter(t, ctx, 10, 1)
		require.NoError(t, l.SetBurst(5))
		assert.Equal(t, 5, l.Burst())
		require.NoError(t, sched.Sleep(ctx, time.Second))
		assert.Equal(t, 5.0, l.Tokens())
		require.NoError(t, l.SetBurst(2))
		assert.Equal(t, 2.0, l.Tokens())
		assert.Equal(t, 3.0, ratelimiter.Dropped(l), "the tokens a smaller bucket cannot hold")
		assert.False(t, l.TryAcquire(3))
		assert.True(t, l.TryAcquire(2))

		for _, b := range []int{0, -3} {
			err := l.SetBurst(b)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "burst "+formatInt(b))
		}
		for _, r := range []float64{0, -1, 2e9} {
			err := l.SetRate(r)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "rate "+formatFloat(r))
		}
		assert.Equal(t, 10.0, l.Rate())
		return nil
	})
}
