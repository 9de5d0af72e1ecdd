package semaphore_test

import (
	"context"
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/semaphore"
)

// parkedAcquire parks one goroutine in Acquire, lets it be granted by a
// Release, and checks it returned nil; inside a bubble, synctest.Wait proves
// the goroutine is durably blocked (a channel of another bubble would not be).
func parkedAcquire(t *testing.T, inBubble bool) {
	s := semaphore.New(1)
	require.NoError(t, s.Acquire(context.Background(), 1))
	done := make(chan error)
	go func() { done <- s.Acquire(context.Background(), 1) }()
	if inBubble {
		synctest.Wait()
		assert.Equal(t, 1, s.Waiters())
	} else {
		for s.Waiters() == 0 {
			runtime.Gosched() // until it parks
		}
	}
	s.Release(1)
	require.NoError(t, <-done)
}

// TestSynctest: a semaphore works in any number of synctest bubbles, before
// and after plain use, and a timeout inside a bubble fires on fake time.
func TestSynctest(t *testing.T) {
	parkedAcquire(t, false) // plain use before any bubble
	for range 3 {
		synctest.Test(t, func(t *testing.T) {
			parkedAcquire(t, true)
			s := semaphore.New(1)
			require.True(t, s.TryAcquire(1))
			start := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			assert.ErrorIs(t, s.Acquire(ctx, 1), context.DeadlineExceeded)
			assert.Equal(t, 3*time.Second, time.Since(start))
		})
	}
	parkedAcquire(t, false) // and after
}
