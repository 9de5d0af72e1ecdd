package ratelimiter_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/ratelimiter"
	"github.com/sluice-go/sluice/sched"
)

// TestParkedFiberStack: a fiber parked in Acquire under the standard
// context.WithTimeout of its own context keeps the first stack it was given
// (2 KiB), as one parked under its plain context does. A fiber parks with
// its whole call on its stack for as long as it waits; had the wait grown
// that stack, every such fiber would hold twice the memory (4 KiB each).
// Measured as goroutine stack bytes in use per parked fiber, over n fibers.
func TestParkedFiberStack(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's instrumentation makes every frame larger")
	}
	const n = 4000
	for _, kind := range []string{"plain", "context.WithTimeout"} {
		t.Run(kind, func(t *testing.T) {
			var perFiber float64
			run(t, func(ctx context.Context) error {
				lim, err := ratelimiter.New(ctx, 1e-3, 1)
				require.NoError(t, err)
				require.True(t, lim.TryAcquire(1))
				before := stackInuse()
				for range n {
					sched.Go(ctx, func(ctx context.Context) error {
						if kind == "context.WithTimeout" {
							c, cancel := context.WithTimeout(ctx, time.Hour)
							defer cancel()
							ctx = c
						}
						_ = lim.Acquire(ctx, 1) // ErrStopped
						return nil
					})
				}
				sched.Yield(ctx) // every fiber has run and parked
				require.Equal(t, n, lim.Waiters())
				perFiber = float64(stackInuse()-before) / n
				lim.Stop()
				return nil
			})
			t.Logf("%.0f stack bytes per parked fiber", perFiber)
			// 2 KiB each, and some slack: the odd fiber grows its stack
			// where an allocation takes the allocator's slow path.
			assert.LessOrEqual(t, perFiber, 3072.0, "stack bytes per parked fiber")
		})
	}
}

// stackInuse is the bytes of goroutine stacks in use, after a collection.
func stackInuse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.StackInuse)
}
