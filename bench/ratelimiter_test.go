package bench_test

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/ratelimit"
	"golang.org/x/time/rate"

	"github.com/sluice-go/sluice/internal/monotime"
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

// newUber returns go.uber.org/ratelimit's limiter at the same rate. At 1e9/s
// its slot is 1 ns away, so a call on a fresh clock reading never sleeps; a
// large slack keeps two goroutines whose readings went stale from sleeping
// too (as the project's side-by-side peer harness does).
func newUber() ratelimit.Limiter {
	return ratelimit.New(int(fastRate), ratelimit.WithSlack(10_000_000))
}

// parallel runs body on g goroutines (RunParallel with GOMAXPROCS rounded
// to g), or on the benchmark's own goroutine for g = 1. Besides ns/op (wall
// time) it reports cpu-ns/op: the process's CPU time per call, which on a
// loaded machine is the steadier figure (see cpuTime).
func parallel(b *testing.B, g int, body func()) {
	b.ReportAllocs()
	start := cpuTime()
	defer func() { b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op") }()
	if g == 1 {
		for b.Loop() {
			body()
		}
		return
	}
	b.SetParallelism(max(1, g/runtime.GOMAXPROCS(0)))
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			body()
		}
	})
}

// lockedRate is a rate as fast as fastRate for the benchmark's purpose
// whose token interval (1e9/7.3e8 ns) is not a whole number of 1/k ns for
// any small k: the limiter decides every call under the queue's lock (see
// the package doc).
const lockedRate = 7.3e8

// BenchmarkTryAcquire: TryAcquire(1) against x/time/rate's Allow, same run,
// on 1 and 2 goroutines; impl=sluice-locked is a rate without the lock-free
// path.
func BenchmarkTryAcquire(b *testing.B) {
	for _, g := range []int{1, 2} {
		b.Run("g="+strconv.Itoa(g)+"/impl=sluice", func(b *testing.B) {
			l := newFast(b)
			parallel(b, g, func() { l.TryAcquire(1) })
		})
		b.Run("g="+strconv.Itoa(g)+"/impl=sluice-locked", func(b *testing.B) {
			l, err := ratelimiter.New(context.Background(), lockedRate, fastBurst)
			if err != nil {
				b.Fatal(err)
			}
			parallel(b, g, func() { l.TryAcquire(1) })
		})
		b.Run("g="+strconv.Itoa(g)+"/impl=xrate", func(b *testing.B) {
			l := rate.NewLimiter(fastRate, fastBurst)
			parallel(b, g, func() { l.Allow() })
		})
		b.Run("g="+strconv.Itoa(g)+"/impl=floor", func(b *testing.B) { parallel(b, g, floorTake()) })
	}
}

// floorTake returns a take that is not a limiter: one read of the monotonic
// clock and a compare-and-swap of one word (GCRA's step with nothing around
// it), the least any limiter that reads the clock and updates one word per
// call can cost. On two goroutines the word's cache line moves between the
// cores on nearly every call, which sets the 2-goroutine rows' floor.
func floorTake() func() {
	word := new(struct {
		_   [64]byte
		tat atomic.Int64
		_   [56]byte
	})
	return func() {
		now := monotime.Now()
		for {
			tat := word.tat.Load()
			if word.tat.CompareAndSwap(tat, max(tat, now)+1) {
				return
			}
		}
	}
}

// BenchmarkAcquireAvailable: goroutine-mode Acquire(ctx, 1) with a token
// available, against rate.Limiter.Wait and go.uber.org/ratelimit's Take, on
// 1 and 2 goroutines.
func BenchmarkAcquireAvailable(b *testing.B) {
	ctx := context.Background()
	for _, g := range []int{1, 2} {
		b.Run("g="+strconv.Itoa(g)+"/impl=sluice", func(b *testing.B) {
			l := newFast(b)
			parallel(b, g, func() { _ = l.Acquire(ctx, 1) })
		})
		b.Run("g="+strconv.Itoa(g)+"/impl=xrate", func(b *testing.B) {
			l := rate.NewLimiter(fastRate, fastBurst)
			parallel(b, g, func() { _ = l.Wait(ctx) })
		})
		b.Run("g="+strconv.Itoa(g)+"/impl=uber", func(b *testing.B) {
			l := newUber()
			parallel(b, g, func() { l.Take() })
		})
	}
}

// BenchmarkContended64: 64 goroutines (RunParallel with parallelism
// 64/GOMAXPROCS) on one limiter, Acquire against rate.Limiter.Wait.
func BenchmarkContended64(b *testing.B) {
	ctx := context.Background()
	b.Run("impl=sluice", func(b *testing.B) {
		l := newFast(b)
		parallel(b, 64, func() { _ = l.Acquire(ctx, 1) })
	})
	b.Run("impl=xrate", func(b *testing.B) {
		l := rate.NewLimiter(fastRate, fastBurst)
		parallel(b, 64, func() { _ = l.Wait(ctx) })
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
