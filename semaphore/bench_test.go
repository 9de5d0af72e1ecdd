package semaphore_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-go/sluice/sched"
	"github.com/sluice-go/sluice/semaphore"
)

// chanSem is the naive baseline: a buffered channel as a counting semaphore
// (no weights, no FIFO guarantee, no Close).
type chanSem chan struct{}

func (c chanSem) Acquire(ctx context.Context) error {
	select {
	case c <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
func (c chanSem) Release() { <-c }

// BenchmarkUncontended: Acquire(1)+Release(1) on a free semaphore, one
// goroutine.
func BenchmarkUncontended(b *testing.B) {
	ctx := context.Background()
	b.Run("impl=sluice", func(b *testing.B) {
		s := semaphore.New(1)
		b.ReportAllocs()
		for b.Loop() {
			_ = s.Acquire(ctx, 1)
			s.Release(1)
		}
	})
	b.Run("impl=chan", func(b *testing.B) {
		s := make(chanSem, 1)
		b.ReportAllocs()
		for b.Loop() {
			_ = s.Acquire(ctx)
			s.Release()
		}
	})
}

// BenchmarkParkedHandoff: two goroutines pass a baton through two
// semaphores, so (nearly) every Acquire parks and is granted by the other
// side's Release. Steady state allocates nothing: waiters are pooled.
func BenchmarkParkedHandoff(b *testing.B) {
	ctx := context.Background()
	b.Run("mode=goroutine", func(b *testing.B) {
		ping, pong := semaphore.New(1), semaphore.New(1)
		ping.TryAcquire(1)
		pong.TryAcquire(1)
		done := make(chan struct{})
		n := b.N
		go func() {
			defer close(done)
			for range n {
				_ = ping.Acquire(ctx, 1)
				pong.Release(1)
			}
		}()
		b.ReportAllocs()
		b.ResetTimer()
		for range n {
			ping.Release(1)
			_ = pong.Acquire(ctx, 1)
		}
		<-done
	})
	b.Run("mode=fiber", func(b *testing.B) {
		ping, pong := semaphore.New(1), semaphore.New(1)
		ping.TryAcquire(1)
		pong.TryAcquire(1)
		n := b.N
		b.ReportAllocs()
		b.ResetTimer()
		_ = sched.Run(ctx, func(ctx context.Context) error {
			sched.Go(ctx, func(ctx context.Context) error {
				for range n {
					if err := ping.Acquire(ctx, 1); err != nil {
						return err
					}
					pong.Release(1)
				}
				return nil
			})
			for range n {
				ping.Release(1)
				if err := pong.Acquire(ctx, 1); err != nil {
					return err
				}
			}
			return nil
		}, sched.Virtual(time.Time{}))
	})
}
