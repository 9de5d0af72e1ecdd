package sched_test

import (
	"context"
	"fmt"
	"iter"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice/sched"
)

// BenchmarkYieldRoundTrip: two fibers take turns; one op is one Yield by
// each (a round trip through the loop). Baseline: BenchmarkGoschedHandoff.
func BenchmarkYieldRoundTrip(b *testing.B) {
	b.ReportAllocs()
	err := sched.Run(context.Background(), func(ctx context.Context) error {
		sched.Go(ctx, func(ctx context.Context) error {
			for i := 0; i < b.N; i++ {
				sched.Yield(ctx)
			}
			return nil
		})
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			sched.Yield(ctx)
		}
		b.StopTimer()
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkGoschedHandoff: two goroutines on one P, each calling
// runtime.Gosched, so each Gosched hands the processor to the other: the
// same hand-off a Yield round trip makes.
func BenchmarkGoschedHandoff(b *testing.B) {
	b.ReportAllocs()
	prev := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(prev)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < b.N; i++ {
			runtime.Gosched()
		}
	}()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		runtime.Gosched()
	}
	wg.Wait()
}

// BenchmarkSpawn: start one fiber and wait for it to end.
func BenchmarkSpawn(b *testing.B) {
	b.ReportAllocs()
	nop := func(context.Context) error { return nil }
	err := sched.Run(context.Background(), func(ctx context.Context) error {
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := sched.Go(ctx, nop).Wait(ctx); err != nil {
				return err
			}
		}
		b.StopTimer()
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkParkWake: two fibers ping-pong through Waiters; one op is one
// park and one wake.
func BenchmarkParkWake(b *testing.B) {
	b.ReportAllocs()
	var ping, pong sched.Waiter
	ping.Reason, pong.Reason = "ping", "pong"
	err := sched.Run(context.Background(), func(ctx context.Context) error {
		pong.Prepare(ctx) // armed for the other fiber below, before it can wake it
		sched.Go(ctx, func(ctx context.Context) error {
			for i := 0; i < b.N; i++ {
				if i > 0 {
					pong.Wake()
				}
				ping.Prepare(ctx)
				if i == 0 {
					pong.Wake()
				}
				if err := ping.Wait(ctx); err != nil {
					return err
				}
			}
			pong.Wake()
			return nil
		})
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := pong.Wait(ctx); err != nil {
				return err
			}
			pong.Prepare(ctx)
			ping.Wake()
		}
		return pong.Wait(ctx)
	})
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkVirtualTimers: N fibers each sleep their own virtual duration
// over and over, a million sleeps in all, each waking its fiber at its exact
// deadline. Reports timer events per second of wall time, including the
// start and end of every fiber, and the process's CPU time per event
// (cpu-ns/event: on a loaded machine, without the time others ran).
// fibers=100000 is the largest shape; the smaller shapes show the cost is
// the memory of many live coroutines (each wake touches a cold fiber
// stack), not the timer heap.
func BenchmarkVirtualTimers(b *testing.B) {
	for _, fibers := range []int{100_000, 10_000, 1_000} {
		b.Run(fmt.Sprintf("fibers=%d", fibers), func(b *testing.B) {
			b.ReportAllocs()
			sleeps := 1_000_000 / fibers
			cpu0 := cpuTime()
			for i := 0; i < b.N; i++ {
				err := sched.Run(context.Background(), func(ctx context.Context) error {
					for j := 0; j < fibers; j++ {
						d := time.Duration(fibers-j) * time.Microsecond
						sched.Go(ctx, func(ctx context.Context) error {
							for k := 0; k < sleeps; k++ {
								if err := sched.Sleep(ctx, d); err != nil {
									return err
								}
							}
							return nil
						})
					}
					return nil
				}, sched.Virtual(time.Time{}))
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(fibers*sleeps*b.N)/b.Elapsed().Seconds(), "events/s")
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(fibers*sleeps*b.N), "cpu-ns/event")
		})
	}
}

// BenchmarkCoroutineFloor is the baseline for BenchmarkVirtualTimers: the
// bare runtime primitive under the fibers, one iter.Pull resume of a
// coroutine picked in a scattered order among N suspended ones, with no
// scheduler, timer or wait around it. Its cost at N=100000 bounds what any
// coroutine-backed fiber can do per wake on this machine.
func BenchmarkCoroutineFloor(b *testing.B) {
	for _, n := range []int{100_000, 10_000, 1_000} {
		b.Run(fmt.Sprintf("fibers=%d", n), func(b *testing.B) {
			nexts := make([]func() (struct{}, bool), n)
			stops := make([]func(), n)
			for i := range nexts {
				nexts[i], stops[i] = iter.Pull(func(yield func(struct{}) bool) {
					for yield(struct{}{}) {
					}
				})
			}
			defer func() {
				for _, stop := range stops {
					stop()
				}
			}()
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime()
			j := 0
			for i := 0; i < b.N; i++ {
				j = (j + 7919) % n // a prime stride: every coroutine, scattered
				nexts[j]()
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/event")
		})
	}
}
