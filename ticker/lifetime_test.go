package ticker_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/ticker"
)

type ctxKey struct{}

// TestWrappedLoopCtx: a ticker made with a loop's ctx under wrappers runs on
// the loop's clock and stops when the run ends; Next on it afterwards
// returns ErrStopped instead of hanging the process.
func TestWrappedLoopCtx(t *testing.T) {
	var tk *ticker.Ticker
	run(t, func(ctx context.Context) error {
		wrapped, cancel := context.WithCancel(context.WithValue(ctx, ctxKey{}, "v"))
		defer cancel()
		tk = newTicker(t, wrapped, 100*ms)
		assert.Equal(t, 100*ms, next(t, ctx, tk))
		return nil
	})
	_, err := tk.Next(context.Background())
	assert.ErrorIs(t, err, ticker.ErrStopped)
}

// TestRequestCtxDoesNotStop: New's ctx chooses the time domain only; outside
// a loop only Stop stops the ticker.
func TestRequestCtxDoesNotStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		req, cancel := context.WithCancel(context.Background())
		tk, err := ticker.New(req, time.Second)
		require.NoError(t, err)
		cancel()
		start := time.Now()
		at, err := tk.Next(context.Background())
		require.NoError(t, err)
		assert.Equal(t, time.Second, at.Sub(start))
		assert.True(t, tk.Stop())
	})
}

// TestSynctest: a ticker runs on a bubble's fake time, in several bubbles,
// and a cancel that comes before a boundary is delivered wins.
func TestSynctest(t *testing.T) {
	for range 3 {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			tk, err := ticker.New(context.Background(), 250*ms)
			require.NoError(t, err)
			defer tk.Stop()
			for k := 1; k <= 4; k++ {
				at, err := tk.Next(context.Background())
				require.NoError(t, err)
				assert.Equal(t, time.Duration(k)*250*ms, at.Sub(start))
				assert.Equal(t, time.Duration(k)*250*ms, time.Since(start))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 100*ms)
			defer cancel()
			_, err = tk.Next(ctx)
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			assert.Equal(t, ticker.Stats{Fired: 4, Consumed: 4}, tk.Stats())
		})
	}
}
