package semaphore_test

import (
	"context"
	"testing"

	"github.com/sluice-go/sluice/semaphore"
)

// TestWeightedAcquireCanceled is golang.org/x/sync/semaphore's regression
// test for go.dev/issue/63615, ported as written (only NewWeighted is New):
// a cancel that happens before the permits are released must win, and the
// permits must pass on.
func TestWeightedAcquireCanceled(t *testing.T) {
	// https://go.dev/issue/63615
	sem := semaphore.New(2)
	ctx, cancel := context.WithCancel(context.Background())
	sem.Acquire(context.Background(), 1)
	ch := make(chan struct{})
	go func() {
		// Synchronize with the Acquire(2) below.
		for sem.TryAcquire(1) {
			sem.Release(1)
		}
		// Now cancel ctx, and then release the token.
		cancel()
		sem.Release(1)
		close(ch)
	}()
	// Since the context being closed happens before enough tokens become available,
	// this Acquire must fail.
	if err := sem.Acquire(ctx, 2); err != context.Canceled {
		t.Errorf("Acquire with canceled context returned wrong error: want context.Canceled, got %v", err)
	}
	// There must always be two tokens in the semaphore after the other
	// goroutine releases the one we held at the start.
	<-ch
	if !sem.TryAcquire(2) {
		t.Fatal("TryAcquire after canceled Acquire failed")
	}
	// Additionally verify that we don't acquire with a done context even when
	// we wouldn't need to block to do so.
	sem.Release(2)
	if err := sem.Acquire(ctx, 1); err != context.Canceled {
		t.Errorf("Acquire with canceled context returned wrong error: want context.Canceled, got %v", err)
	}
}

// TestWeightedAcquireCanceledRepeated runs the x/sync test 200 times in one
// process: the cancel must win against the release in every interleaving
// the goroutines happen to take, not only in one.
func TestWeightedAcquireCanceledRepeated(t *testing.T) {
	for range 200 {
		TestWeightedAcquireCanceled(t)
		if t.Failed() {
			return
		}
	}
}
