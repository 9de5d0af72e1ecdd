//go:build linux || darwin

package bench_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"

	"github.com/sluice-go/sluice/sharedbucket"
)

// The sharedbucket benchmarks against golang.org/x/time/rate, both in the
// same run. Allow benchmarks use a policy that never denies (T = 1 ns,
// b = 2^40); deny benchmarks a bucket already drained. The sharedbucket
// package's own benchmarks (coarse clock, decisions, hash, stats) are in
// sharedbucket/bench_test.go.

var neverDeny = sharedbucket.Policy{Limit: 1e9, Window: time.Second, Burst: 1 << 40}

// benchTable opens a table on tmpfs when the host has one (a table's home
// in production), else in a temporary directory.
func benchTable(b *testing.B, p sharedbucket.Policy, opts ...sharedbucket.Option) *sharedbucket.Table {
	b.Helper()
	dir := b.TempDir()
	if d, err := os.MkdirTemp("/dev/shm", "sluice-bench-"); err == nil {
		b.Cleanup(func() { os.RemoveAll(d) })
		dir = d
	}
	tb, err := sharedbucket.Open(filepath.Join(dir, "bench.sbt"), p, opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tb.Close() })
	return tb
}

// cpuMetric starts measuring the benchmark goroutine's CPU time and
// returns the function that reports it as cpu-ns/op. Why: on a machine
// shared with other work, ns/op counts the time the benchmark sat
// descheduled; the thread's CPU time does not.
func cpuMetric(b *testing.B) func() {
	runtime.LockOSThread()
	c0 := threadCPU()
	return func() {
		b.ReportMetric(float64(threadCPU()-c0)/float64(b.N), "cpu-ns/op")
		runtime.UnlockOSThread()
	}
}

func threadCPU() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return ts.Nano()
}

// allowLoop calls allow b.N times and fails unless every call allowed.
func allowLoop(b *testing.B, allow func() bool) {
	b.ReportAllocs()
	n := 0
	defer cpuMetric(b)()
	for b.Loop() {
		if allow() {
			n++
		}
	}
	if n != b.N {
		b.Fatalf("allowed %d of %d", n, b.N)
	}
}

// BenchmarkSharedbucketSingleKey: one hot key, one goroutine.
func BenchmarkSharedbucketSingleKey(b *testing.B) {
	b.Run("impl=sharedbucket.Bucket", func(b *testing.B) {
		allowLoop(b, benchTable(b, neverDeny).Bucket("hot").Allow)
	})
	b.Run("impl=x/time/rate", func(b *testing.B) {
		allowLoop(b, rate.NewLimiter(rate.Limit(1e9), 1<<40).Allow)
	})
}

func benchKeys(n int) []string {
	r := rand.New(rand.NewPCG(1, 2))
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("client-%08x", r.Uint32())
	}
	// Visit them in a random order, as traffic would.
	r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	return keys
}

// BenchmarkSharedbucketKeyed100k: 100,000 keys visited in turn, against a
// sync.Map of rate.Limiter (the usual per-key x/time/rate).
func BenchmarkSharedbucketKeyed100k(b *testing.B) {
	keys := benchKeys(100_000)
	b.Run("impl=sharedbucket.Table", func(b *testing.B) {
		tb := benchTable(b, neverDeny, sharedbucket.WithSlots(1<<18))
		i := 0
		allowLoop(b, func() bool {
			ok := tb.Allow(keys[i])
			if i++; i == len(keys) {
				i = 0
			}
			return ok
		})
	})
	b.Run("impl=sync.Map-of-rate.Limiter", func(b *testing.B) {
		var m sync.Map
		i := 0
		allowLoop(b, func() bool {
			v, ok := m.Load(keys[i])
			if !ok {
				v, _ = m.LoadOrStore(keys[i], rate.NewLimiter(rate.Limit(1e9), 1<<40))
			}
			if i++; i == len(keys) {
				i = 0
			}
			return v.(*rate.Limiter).Allow()
		})
	})
}

// par2 runs body on exactly 2 goroutines (one per core on a 2-core
// machine); ns/op is wall time per operation summed over both, so perfect
// scaling halves the single-goroutine figure.
func par2(b *testing.B, body func(id int, pb *testing.PB)) {
	b.Helper()
	if runtime.GOMAXPROCS(0) != 2 {
		b.Logf("GOMAXPROCS=%d; these figures are for 2", runtime.GOMAXPROCS(0))
	}
	b.ReportAllocs()
	b.SetParallelism(1)
	var next atomic.Int32
	b.RunParallel(func(pb *testing.PB) {
		body(int(next.Add(1)-1), pb)
	})
}

// BenchmarkSharedbucketPar2DistinctKeys: each goroutine its own key (the
// keys are picked blind, so their slots may share a cache line; the
// sharedbucket package's own benchmark of the name picks them apart).
func BenchmarkSharedbucketPar2DistinctKeys(b *testing.B) {
	b.Run("impl=sharedbucket.Bucket", func(b *testing.B) {
		tb := benchTable(b, neverDeny)
		par2(b, func(id int, pb *testing.PB) {
			bk := tb.Bucket(fmt.Sprintf("key-%d", id))
			for pb.Next() {
				bk.Allow()
			}
		})
	})
	b.Run("impl=x/time/rate-per-goroutine", func(b *testing.B) {
		par2(b, func(_ int, pb *testing.PB) {
			lim := rate.NewLimiter(rate.Limit(1e9), 1<<40)
			for pb.Next() {
				lim.Allow()
			}
		})
	})
}

// BenchmarkSharedbucketPar2SameKeyDenied: two goroutines asking a drained
// bucket.
func BenchmarkSharedbucketPar2SameKeyDenied(b *testing.B) {
	b.Run("impl=sharedbucket.Bucket", func(b *testing.B) {
		bk := benchTable(b, sharedbucket.Policy{Limit: 1, Window: time.Hour}).Bucket("drained")
		if !bk.Allow() || bk.Allow() {
			b.Fatal("could not drain")
		}
		par2(b, func(_ int, pb *testing.PB) {
			for pb.Next() {
				bk.Allow()
			}
		})
	})
	b.Run("impl=x/time/rate", func(b *testing.B) {
		lim := rate.NewLimiter(rate.Every(time.Hour), 1)
		lim.Allow()
		par2(b, func(_ int, pb *testing.PB) {
			for pb.Next() {
				lim.Allow()
			}
		})
	})
}

// BenchmarkSharedbucketPar2SameKeyAllowed is the contention case: two cores
// spend on one bucket; its cost is the cache line moving between cores.
func BenchmarkSharedbucketPar2SameKeyAllowed(b *testing.B) {
	b.Run("impl=sharedbucket.Bucket", func(b *testing.B) {
		bk := benchTable(b, neverDeny).Bucket("hot")
		par2(b, func(_ int, pb *testing.PB) {
			for pb.Next() {
				bk.Allow()
			}
		})
	})
	b.Run("impl=x/time/rate", func(b *testing.B) {
		lim := rate.NewLimiter(rate.Limit(1e9), 1<<40)
		par2(b, func(_ int, pb *testing.PB) {
			for pb.Next() {
				lim.Allow()
			}
		})
	})
}
