package sched_test

import (
	"container/heap"
	"context"
	"fmt"
	"iter"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
// bare runtime primitive under the fibers, with no scheduler, timer or wait
// around it. One op is the same life as one op there: N coroutines made with
// iter.Pull, resumed once to start and then once per sleep, in exactly the
// order the run wakes its fibers (by deadline, then arming order: computed
// before the timer starts), until each returns. Why this order and not a
// scattered one (a prime stride, say): resuming coroutines costs what their
// memory costs to reach, and the wake order of the fibers, a few runs of
// neighbours, is kinder to caches than a stride; a floor resumed in another
// order measures another workload. Why the making and the ends inside the
// op: the fibers' op pays for them too (the stacks of 100,000 new
// coroutines, most of their cost at that size, are the runtime's, not the
// scheduler's). events/s and cpu-ns/event count the sleeps, as there.
func BenchmarkCoroutineFloor(b *testing.B) {
	for _, n := range []int{100_000, 10_000, 1_000} {
		b.Run(fmt.Sprintf("fibers=%d", n), func(b *testing.B) {
			sleeps := 1_000_000 / n
			order := sleepOrder(n, sleeps)
			nexts := make([]func() (struct{}, bool), n)
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime()
			for i := 0; i < b.N; i++ {
				for j := range nexts {
					nexts[j], _ = iter.Pull(func(yield func(struct{}) bool) {
						for k := 0; k < sleeps && yield(struct{}{}); k++ {
						}
					})
				}
				for _, j := range order {
					nexts[j]()
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(n*sleeps*b.N)/b.Elapsed().Seconds(), "events/s")
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(n*sleeps*b.N), "cpu-ns/event")
		})
	}
}

// sleepOrder returns the order in which BenchmarkVirtualTimers resumes its
// fibers under FIFO: each fiber j starts in turn, then every wake in
// (deadline, arming order), fiber j sleeping (n-j) µs each time, until each
// has slept sleeps times; the last resume of each ends it.
func sleepOrder(n, sleeps int) []int32 {
	order := make([]int32, 0, n*(sleeps+1))
	var h wakeHeap
	for j := range n {
		order = append(order, int32(j))
		heap.Push(&h, wake{when: n - j, seq: len(order), fiber: j})
	}
	left := make([]int, n)
	for j := range left {
		left[j] = sleeps
	}
	for h.Len() > 0 {
		w := heap.Pop(&h).(wake)
		order = append(order, int32(w.fiber))
		if left[w.fiber]--; left[w.fiber] > 0 {
			heap.Push(&h, wake{when: w.when + n - w.fiber, seq: len(order), fiber: w.fiber})
		}
	}
	return order
}

// A wake is one armed sleep of sleepOrder's model: a deadline in µs, the
// arming order, the fiber.
type wake struct{ when, seq, fiber int }

type wakeHeap []wake

func (h wakeHeap) Len() int { return len(h) }
func (h wakeHeap) Less(i, j int) bool {
	if h[i].when != h[j].when {
		return h[i].when < h[j].when
	}
	return h[i].seq < h[j].seq
}
func (h wakeHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *wakeHeap) Push(x any)   { *h = append(*h, x.(wake)) }
func (h *wakeHeap) Pop() any {
	old := *h
	w := old[len(old)-1]
	*h = old[:len(old)-1]
	return w
}

// The floor's order is the fibers': BenchmarkVirtualTimers' shape, small,
// records which fiber each resume ran.
func TestSleepOrderIsTheRunsOrder(t *testing.T) {
	const n, sleeps = 300, 7
	var got []int32
	err := sched.Run(context.Background(), func(ctx context.Context) error {
		for j := 0; j < n; j++ {
			d := time.Duration(n-j) * time.Microsecond
			sched.Go(ctx, func(ctx context.Context) error {
				got = append(got, int32(j))
				for k := 0; k < sleeps; k++ {
					if err := sched.Sleep(ctx, d); err != nil {
						return err
					}
					got = append(got, int32(j))
				}
				return nil
			})
		}
		return nil
	}, sched.Virtual(time.Time{}))
	require.NoError(t, err)
	require.Equal(t, sleepOrder(n, sleeps), got)
}
