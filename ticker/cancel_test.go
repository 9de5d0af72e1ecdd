package ticker_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/ticker"
)

// TestCancelBeforeBoundaryWins is x/sync's TestWeightedAcquireCanceled for
// the ticker: the waiter's ctx is cancelled and only then does the boundary
// pass (the mock's timer runs on a goroutine of its own, racing with the
// waiter noticing its ctx). Next must return context.Canceled and leave the
// boundary for the next caller, in each of 300 runs of the race.
func TestCancelBeforeBoundaryWins(t *testing.T) {
	for i := range 300 {
		mock := clock.NewMock()
		tk, err := ticker.New(context.Background(), time.Second, ticker.WithClock(mock))
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { _, err := tk.Next(ctx); errc <- err }()
		for tk.Waiters() == 0 {
			runtime.Gosched()
		}
		cancel()
		mock.Add(time.Second)
		require.ErrorIs(t, <-errc, context.Canceled, "round %d", i)
		at, err := tk.Next(context.Background())
		require.NoError(t, err)
		assert.Equal(t, time.Second, at.Sub(time.Unix(0, 0)), "round %d: the boundary passed on", i)
		tk.Stop()
	}
}
