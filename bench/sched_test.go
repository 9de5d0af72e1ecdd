package bench_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluice-go/sluice/ratelimiter"
	"github.com/sluice-go/sluice/sched"
)

// The shapes of the run-loop scaling benchmarks: N waiting fibers, and the
// context each waits under.
var (
	scaleFibers = []int{1_000, 4_000, 16_000, 64_000}
	scaleKinds  = []string{"plain", "sched.WithTimeout", "context.WithTimeout"}
)

// acquireUnder takes one token of lim under a context of the given kind
// made from the fiber's ctx.
func acquireUnder(ctx context.Context, kind string, lim *ratelimiter.Limiter) error {
	switch kind {
	case "sched.WithTimeout":
		c, cancel := sched.WithTimeout(ctx, time.Hour)
		defer cancel()
		ctx = c
	case "context.WithTimeout":
		c, cancel := context.WithTimeout(ctx, time.Hour)
		defer cancel()
		ctx = c
	}
	return lim.Acquire(ctx, 1)
}

// BenchmarkRunLoopScaling: one sched.Run under a virtual clock, N fibers,
// each takes one token of a 1e6/s limiter with a burst of 1 under a context
// of the given kind (the fiber's own, sched.WithTimeout or
// context.WithTimeout, of an hour: none ends a wait), then returns: nearly
// every fiber parks behind the others. One op is the whole run; ns/fiber is
// its wall time over N, cpu-ns/fiber the process's CPU time (user and
// system, every thread: the collector's too) over N, which on a loaded
// machine leaves out the time other processes ran.
// kind=goroutines/x-time-rate is the baseline: N goroutines each waiting on
// one golang.org/x/time/rate limiter of the same rate and burst under
// context.WithTimeout, on real time (at least N µs of it: 1e6/s). Those
// goroutines end about as fast as they start, so few are alive at once;
// kind=goroutines/all-parked is the baseline of the same shape as the
// fibers': N goroutines all parked on one channel before the first is
// released, then released one at a time (N stacks live at once, as N
// parked fibers hold).
//
//	for i in 1 2 3 4 5; do go test -run '^$' -bench RunLoopScaling -benchmem ./bench; done
func BenchmarkRunLoopScaling(b *testing.B) {
	for _, kind := range scaleKinds {
		for _, n := range scaleFibers {
			b.Run(fmt.Sprintf("kind=%s/fibers=%d", kind, n), func(b *testing.B) {
				b.ReportAllocs()
				cpu0 := cpuTime()
				for b.Loop() {
					err := sched.Run(context.Background(), func(ctx context.Context) error {
						lim, err := ratelimiter.New(ctx, 1e6, 1)
						if err != nil {
							return err
						}
						for range n {
							sched.Go(ctx, func(ctx context.Context) error {
								return acquireUnder(ctx, kind, lim)
							})
						}
						return nil
					}, sched.Virtual(time.Time{}))
					if err != nil {
						b.Fatal(err)
					}
				}
				reportPerFiber(b, n, cpuTime()-cpu0)
			})
		}
	}
	for _, n := range scaleFibers {
		b.Run(fmt.Sprintf("kind=goroutines/x-time-rate/fibers=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			cpu0 := cpuTime()
			for b.Loop() {
				lim := rate.NewLimiter(1e6, 1)
				var wg sync.WaitGroup
				errs := make(chan error, 1)
				for range n {
					wg.Go(func() {
						ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
						defer cancel()
						if err := lim.Wait(ctx); err != nil {
							select {
							case errs <- err:
							default:
							}
						}
					})
				}
				wg.Wait()
				select {
				case err := <-errs:
					b.Fatal(err)
				default:
				}
			}
			reportPerFiber(b, n, cpuTime()-cpu0)
		})
	}
	for _, n := range scaleFibers {
		b.Run(fmt.Sprintf("kind=goroutines/all-parked/fibers=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			cpu0 := cpuTime()
			for b.Loop() {
				release := make(chan struct{})
				var started, done sync.WaitGroup
				started.Add(n)
				for range n {
					done.Go(func() {
						started.Done()
						<-release
					})
				}
				started.Wait()
				for range n {
					release <- struct{}{}
				}
				done.Wait()
			}
			reportPerFiber(b, n, cpuTime()-cpu0)
		})
	}
}

// reportPerFiber reports wall and CPU time per fiber of b's ops of n fibers.
func reportPerFiber(b *testing.B, n int, cpu time.Duration) {
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/fiber")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*n), "cpu-ns/fiber")
}

// BenchmarkParkedMemory: the memory one parked waiter holds, read from
// runtime.MemStats (live heap plus stacks, after a collection) before and
// after 64k of them park: fibers parked in a limiter's Acquire under the
// fiber's own context and under context.WithTimeout, against goroutines
// parked in x/time/rate's Wait under context.WithTimeout, and goroutines
// blocked on a channel (the least a parked goroutine holds). Reported as
// B/parked; one op parks and releases all 64k.
//
//	go test -run '^$' -bench ParkedMemory -benchtime 1x -count 5 ./sched
func BenchmarkParkedMemory(b *testing.B) {
	n := parkedN
	for _, kind := range []string{"plain", "context.WithTimeout"} {
		b.Run("fibers/kind="+kind, func(b *testing.B) {
			var total float64
			for b.Loop() {
				err := sched.Run(context.Background(), func(ctx context.Context) error {
					lim, err := ratelimiter.New(ctx, 1e-3, 1)
					if err != nil {
						return err
					}
					if !lim.TryAcquire(1) {
						return fmt.Errorf("no token")
					}
					before := liveBytes()
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
					if w := lim.Waiters(); w != n {
						return fmt.Errorf("%d parked, want %d", w, n)
					}
					total += float64(liveBytes()-before) / float64(n)
					lim.Stop()
					return nil
				}, sched.Virtual(time.Time{}))
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(total/float64(b.N), "B/parked")
		})
	}
	b.Run("goroutines/x-time-rate", func(b *testing.B) {
		var total float64
		for b.Loop() {
			lim := rate.NewLimiter(1e-3, 1)
			lim.Allow()
			stop, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			before := liveBytes()
			for range n {
				wg.Go(func() {
					// Long enough for the last reservation (n÷rate), or
					// Wait would refuse to park.
					ctx, cancelT := context.WithTimeout(stop, 10*365*24*time.Hour)
					defer cancelT()
					_ = lim.Wait(ctx)
				})
			}
			// Wait reserves under the limiter's lock before it parks: every
			// reservation made means every goroutine is at its select.
			for lim.TokensAt(time.Now()) > 0.5-float64(n) {
				runtime.Gosched()
			}
			total += float64(liveBytes()-before) / float64(n)
			cancel()
			wg.Wait()
		}
		b.ReportMetric(total/float64(b.N), "B/parked")
	})
	b.Run("goroutines/channel", func(b *testing.B) {
		var total float64
		for b.Loop() {
			ch := make(chan struct{})
			var wg, started sync.WaitGroup
			before := liveBytes()
			started.Add(n)
			for range n {
				wg.Go(func() {
					started.Done()
					<-ch
				})
			}
			started.Wait()
			total += float64(liveBytes()-before) / float64(n)
			close(ch)
			wg.Wait()
		}
		b.ReportMetric(total/float64(b.N), "B/parked")
	})
}

// parkedN is the number of waiters BenchmarkParkedMemory parks.
var parkedN = 64_000

// liveBytes is the live heap and the stacks in use, after a collection.
func liveBytes() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc + m.StackInuse)
}
