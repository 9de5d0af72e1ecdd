package ratelimiter_test

import (
	"context"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluice-go/sluice/ratelimiter"
	"github.com/sluice-go/sluice/sched"
)

// Limits for the "a token is always there" benchmarks: both limiters refill
// far faster than any caller can take, so nothing ever waits and the figure
// is the cost of the call itself.
const (
	fastRate  = 1e9
	fastBurst = 1 << 20
)

func newFast(b *testing.B) *ratelimiter.Limiter {
	l, err := ratelimiter.New(context.Background(), fastRate, fastBurst)
	if err != nil {
		b.Fatal(err)
	}
	return l
}

// BenchmarkTryAcquire: TryAcquire(1) against x/time/rate's Allow, same run.
func BenchmarkTryAcquire(b *testing.B) {
	b.Run("impl=sluice", func(b *testing.B) {
		l := newFast(b)
		b.ReportAllocs()
		for b.Loop() {
			l.TryAcquire(1)
		}
	})
	b.Run("impl=xrate", func(b *testing.B) {
		l := rate.NewLimiter(fastRate, fastBurst)
		b.ReportAllocs()
		for b.Loop() {
			l.Allow()
		}
	})
}

// BenchmarkAcquireAvailable: goroutine-mode Acquire(ctx, 1) with a token
// available, against rate.Limiter.Wait.
func BenchmarkAcquireAvailable(b *testing.B) {
	ctx := context.Background()
	b.Run("impl=sluice", func(b *testing.B) {
		l := newFast(b)
		b.ReportAllocs()
		for b.Loop() {
			_ = l.Acquire(ctx, 1)
		}
	})
	b.Run("impl=xrate", func(b *testing.B) {
		l := rate.NewLimiter(fastRate, fastBurst)
		b.ReportAllocs()
		for b.Loop() {
			_ = l.Wait(ctx)
		}
	})
}

// BenchmarkContended64: 64 goroutines (RunParallel with parallelism
// 64/GOMAXPROCS) on one limiter, Acquire against rate.Limiter.Wait.
func BenchmarkContended64(b *testing.B) {
	ctx := context.Background()
	par := func(b *testing.B) {
		p := 64 / max(1, testingProcs())
		b.SetParallelism(max(1, p))
	}
	b.Run("impl=sluice", func(b *testing.B) {
		l := newFast(b)
		par(b)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_ = l.Acquire(ctx, 1)
			}
		})
	})
	b.Run("impl=xrate", func(b *testing.B) {
		l := rate.NewLimiter(fastRate, fastBurst)
		par(b)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_ = l.Wait(ctx)
			}
		})
	})
}

// BenchmarkParkedAcquire: the steady state of parked acquires. Ten fibers
// on a 1 token/µs limiter with a burst of 1 under a virtual clock: every
// Acquire parks and is woken by the refill. Reports allocations per Acquire
// (the waiters are pooled, so 0), and the same for goroutines on real time.
func BenchmarkParkedAcquire(b *testing.B) {
	b.Run("mode=fiber", func(b *testing.B) {
		n := b.N
		b.ReportAllocs()
		err := sched.Run(context.Background(), func(ctx context.Context) error {
			l, err := ratelimiter.New(ctx, 1e6, 1)
			if err != nil {
				return err
			}
			l.TryAcquire(1)
			var fibers []*sched.Fiber
			for i := range 10 {
				fibers = append(fibers, sched.Go(ctx, func(ctx context.Context) error {
					for j := i; j < n; j += 10 {
						if err := l.Acquire(ctx, 1); err != nil {
							return err
						}
					}
					return nil
				}))
			}
			for _, f := range fibers {
				if err := f.Wait(ctx); err != nil {
					return err
				}
			}
			return nil
		}, sched.Virtual(time.Time{}))
		if err != nil {
			b.Fatal(err)
		}
	})
	b.Run("mode=goroutine", func(b *testing.B) {
		// Goroutines on a limiter whose tokens come every 2µs, burst 1:
		// nearly every Acquire parks on the real clock.
		l, err := ratelimiter.New(context.Background(), 5e5, 1)
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		b.ReportAllocs()
		b.SetParallelism(8) // 16 goroutines: one refill wakes several
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_ = l.Acquire(ctx, 1)
			}
		})
	})
}

// BenchmarkVirtualHour: one virtual hour of a 100/s limiter shared by 10
// fibers (360,003 grants). Reports the wall time per virtual hour.
func BenchmarkVirtualHour(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		granted := 0
		err := sched.Run(context.Background(), func(ctx context.Context) error {
			l, err := ratelimiter.New(ctx, 100, 1)
			if err != nil {
				return err
			}
			hctx, cancel := sched.WithTimeout(ctx, time.Hour)
			defer cancel()
			var fibers []*sched.Fiber
			for range 10 {
				fibers = append(fibers, sched.Go(hctx, func(ctx context.Context) error {
					for l.Acquire(ctx, 1) == nil {
						granted++
					}
					return nil
				}))
			}
			for _, f := range fibers {
				_ = f.Wait(ctx)
			}
			return nil
		}, sched.Virtual(time.Time{}))
		if err != nil {
			b.Fatal(err)
		}
		if granted < 360000 {
			b.Fatalf("granted %d in a virtual hour, want 360000", granted)
		}
	}
}
