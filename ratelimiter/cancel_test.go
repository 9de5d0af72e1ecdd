package ratelimiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/ratelimiter"
)

// TestCancelBeforeGrantWins is x/sync's TestWeightedAcquireCanceled for the
// limiter: the waiter's ctx is cancelled and only then is its token
// credited (the mock's refill runs on a goroutine of its own, racing with
// the waiter noticing its ctx). The cancel came first, so Acquire must
// return context.Canceled, and the token must stay for the next caller,
// in each of 300 runs of the race.
func TestCancelBeforeGrantWins(t *testing.T) {
	for i := range 300 {
		mock := clock.NewMock()
		l, err := ratelimiter.New(context.Background(), 10, 1, ratelimiter.WithClock(mock))
		require.NoError(t, err)
		require.True(t, l.TryAcquire(1))
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- l.Acquire(ctx, 1) }()
		waitFor(t, "the waiter to park", func() bool { return l.Waiters() == 1 })
		cancel()
		mock.Add(100 * time.Millisecond) // the token is due: the refill races the cancel
		require.ErrorIs(t, <-errc, context.Canceled, "round %d", i)
		waitFor(t, "the token to be credited", func() bool { return l.Tokens() == 1 })
		assert.True(t, l.TryAcquire(1), "round %d: the token passed on", i)
	}
}
