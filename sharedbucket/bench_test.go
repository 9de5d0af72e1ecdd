//go:build linux || darwin

package sharedbucket

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Benchmarks: go test -run '^$' -bench . -count 5 -benchmem ./sharedbucket
// Each figure has its baseline in the same run; the comparisons with
// x/time/rate are in the bench module (bench/sharedbucket_test.go). Allow
// benchmarks use a policy that never denies (T = 1 ns, b = 2^40); deny
// benchmarks a bucket already drained.

var neverDeny = Policy{Limit: 1e9, Window: time.Second, Burst: 1 << 40}

func benchTable(b *testing.B, p Policy, opts ...Option) *Table {
	b.Helper()
	tb, err := Open(filepath.Join(tmpfsDir(b), "bench.sbt"), p, opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tb.Close() })
	return tb
}

// cpuMetric starts measuring the benchmark goroutine's CPU time and
// returns the function that reports it as cpu-ns/op. Why: on a machine
// shared with other work, ns/op counts the time the benchmark sat
// descheduled; the thread's CPU time does not (cache and core contention
// still show).
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

// coarse is the option of the "-coarse" variants: the clock read once per
// millisecond by a goroutine instead of on every call (WithCoarseClock).
var coarse = WithCoarseClock(time.Millisecond)

// clockVariants runs f for the default clock and for the coarse clock.
func clockVariants(b *testing.B, name string, f func(b *testing.B, opts ...Option)) {
	b.Run("impl="+name, func(b *testing.B) { f(b) })
	b.Run("impl="+name+"-coarse", func(b *testing.B) { f(b, coarse) })
}

func BenchmarkSingleKey(b *testing.B) {
	clockVariants(b, "sharedbucket.Bucket", func(b *testing.B, opts ...Option) {
		bk := benchTable(b, neverDeny, opts...).Bucket("hot")
		b.ReportAllocs()
		n := 0
		defer cpuMetric(b)()
		for b.Loop() {
			if bk.Allow() {
				n++
			}
		}
		if n != b.N {
			b.Fatalf("allowed %d of %d", n, b.N)
		}
	})
	b.Run("impl=floor", benchFloor)
}

// benchFloor is not a limiter: it is the least a check on this clock can
// cost, one clock read and a compare-and-swap of one word (GCRA's step with
// nothing around it), so that a ratio to x/time/rate can be read against
// what the clock and the CAS alone leave on this machine.
func benchFloor(b *testing.B) {
	var word struct {
		_   [64]byte
		tat atomic.Int64
		_   [56]byte
	}
	b.ReportAllocs()
	defer cpuMetric(b)()
	for b.Loop() {
		now := nanotime()
		for {
			tat := word.tat.Load()
			if word.tat.CompareAndSwap(tat, max(tat, now)+1) {
				break
			}
		}
	}
}

func BenchmarkKeyedHot(b *testing.B) {
	clockVariants(b, "sharedbucket.Table", func(b *testing.B, opts ...Option) {
		tb := benchTable(b, neverDeny, opts...)
		b.ReportAllocs()
		n := 0
		defer cpuMetric(b)()
		for b.Loop() {
			if tb.Allow("tenant-a:/api") {
				n++
			}
		}
		if n != b.N {
			b.Fatalf("allowed %d of %d", n, b.N)
		}
	})
}

// BenchmarkDecide: the decision with its figures (what the shm store makes
// per request) against the bare decision, both at explicit times (no clock
// read), and live.
func BenchmarkDecide(b *testing.B) {
	tb := benchTable(b, neverDeny)
	const key = "tenant-a:/api"
	b.Run("impl=Table.AllowAt", func(b *testing.B) {
		b.ReportAllocs()
		n, now := 0, Now()
		defer cpuMetric(b)()
		for b.Loop() {
			now++
			if tb.AllowAt(key, 1, now) {
				n++
			}
		}
		if n != b.N {
			b.Fatalf("allowed %d of %d", n, b.N)
		}
	})
	b.Run("impl=Table.DecideAt", func(b *testing.B) {
		b.ReportAllocs()
		var rem float64
		n, now := 0, Now()
		defer cpuMetric(b)()
		for b.Loop() {
			now++
			d := tb.DecideAt(key, 1, now)
			if d.Allowed {
				n++
			}
			rem += d.Remaining
		}
		if n != b.N || rem == 0 {
			b.Fatalf("allowed %d of %d", n, b.N)
		}
	})
	b.Run("impl=Table.DecideN", func(b *testing.B) {
		b.ReportAllocs()
		n := 0
		defer cpuMetric(b)()
		for b.Loop() {
			if tb.DecideN(key, 1).Allowed {
				n++
			}
		}
		if n != b.N {
			b.Fatalf("allowed %d of %d", n, b.N)
		}
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

// allowEach asks tb for keys in turn, once per iteration, and fails unless
// every call is allowed.
func allowEach(b *testing.B, tb *Table, keys []string) {
	b.ReportAllocs()
	n, i := 0, 0
	defer cpuMetric(b)()
	for b.Loop() {
		if tb.Allow(keys[i]) {
			n++
		}
		if i++; i == len(keys) {
			i = 0
		}
	}
	if n != b.N {
		b.Fatalf("allowed %d of %d", n, b.N)
	}
}

func BenchmarkKeyed100k(b *testing.B) {
	keys := benchKeys(100_000)
	clockVariants(b, "sharedbucket.Table", func(b *testing.B, opts ...Option) {
		tb := benchTable(b, neverDeny, append(opts, WithSlots(1<<18))...)
		allowEach(b, tb, keys)
	})
}

// distinctLineKeys returns n keys whose slots in tb sit on different cache
// lines (4 slots per line), so the benchmark measures scaling, not false
// sharing between two hot keys that happen to be neighbours.
func distinctLineKeys(tb *Table, n int) []string {
	lines := map[uint64]bool{}
	var keys []string
	for i := 0; len(keys) < n; i++ {
		k := fmt.Sprintf("key-%d", i)
		line := (tb.hk.hash(k) & tb.mask) / 4
		if !lines[line] && !lines[line-1] && !lines[line+1] {
			lines[line] = true
			keys = append(keys, k)
		}
	}
	return keys
}

// par2 runs body on exactly 2 goroutines (one per core on a 2-core
// machine); ns/op is wall time per operation summed over both, so perfect
// scaling halves the single-goroutine figure.
func par2(b *testing.B, body func(id int, pb *testing.PB)) {
	b.Helper()
	if runtime.GOMAXPROCS(0) != 2 {
		b.Logf("GOMAXPROCS=%d; these figures are for 2", runtime.GOMAXPROCS(0))
	}
	b.SetParallelism(1)
	var next atomic.Int32
	b.RunParallel(func(pb *testing.PB) {
		body(int(next.Add(1)-1), pb)
	})
}

func BenchmarkPar2DistinctKeys(b *testing.B) {
	clockVariants(b, "sharedbucket.Bucket", func(b *testing.B, opts ...Option) {
		tb := benchTable(b, neverDeny, opts...)
		keys := distinctLineKeys(tb, runtime.GOMAXPROCS(0))
		b.ReportAllocs()
		var denied atomic.Int64
		par2(b, func(id int, pb *testing.PB) {
			bk := tb.Bucket(keys[id])
			d := 0
			for pb.Next() {
				if !bk.Allow() {
					d++
				}
			}
			denied.Add(int64(d))
		})
		if denied.Load() != 0 {
			b.Fatalf("denied %d", denied.Load())
		}
	})
	b.Run("impl=sharedbucket.Table", func(b *testing.B) {
		tb := benchTable(b, neverDeny)
		keys := distinctLineKeys(tb, runtime.GOMAXPROCS(0))
		b.ReportAllocs()
		par2(b, func(id int, pb *testing.PB) {
			k := keys[id]
			for pb.Next() {
				tb.Allow(k)
			}
		})
	})
}

func BenchmarkPar2SameKeyDenied(b *testing.B) {
	clockVariants(b, "sharedbucket.Bucket", func(b *testing.B, opts ...Option) {
		tb := benchTable(b, Policy{Limit: 1, Window: time.Hour}, opts...)
		bk := tb.Bucket("drained")
		if !bk.AllowN(1) || bk.AllowN(1) {
			b.Fatal("could not drain")
		}
		b.ReportAllocs()
		var allowed atomic.Int64
		par2(b, func(_ int, pb *testing.PB) {
			a := 0
			for pb.Next() {
				if bk.AllowN(1) {
					a++
				}
			}
			allowed.Add(int64(a))
		})
		if allowed.Load() != 0 {
			b.Fatalf("allowed %d", allowed.Load())
		}
	})
}

// BenchmarkPar2SameKeyAllowed is the contention case: two cores spend on
// one bucket. Its cost is the cache line moving between cores; the metric
// that matters is fail-opens (Contended), which must stay 0.
func BenchmarkPar2SameKeyAllowed(b *testing.B) {
	clockVariants(b, "sharedbucket.Bucket", func(b *testing.B, opts ...Option) {
		tb := benchTable(b, neverDeny, opts...)
		bk := tb.Bucket("hot")
		b.ReportAllocs()
		par2(b, func(_ int, pb *testing.PB) {
			for pb.Next() {
				bk.AllowN(1)
			}
		})
		b.ReportMetric(float64(tb.Stats().Contended), "failopens")
	})
}

var sinkInt64 int64

// BenchmarkClock is the floor under every live check: one reading of the
// clock sharedbucket uses, and time.Now for comparison.
func BenchmarkClock(b *testing.B) {
	b.Run("impl=sharedbucket.Now", func(b *testing.B) {
		var s int64
		defer cpuMetric(b)()
		for b.Loop() {
			s += Now()
		}
		sinkInt64 = s
	})
	b.Run("impl=time.Now", func(b *testing.B) {
		var s int64
		defer cpuMetric(b)()
		for b.Loop() {
			s += time.Now().UnixNano()
		}
		sinkInt64 = s
	})
}

// BenchmarkHash is the keyed hash of a 13-byte key, and of a 64-byte one,
// with SipHash-1-3 (the hash of format version 2) as the baseline.
func BenchmarkHash(b *testing.B) {
	hk := newHasher(1, 2)
	for _, key := range []string{"tenant-a:/api", "tenant-0042:/api/v1/customers/orders/items?page=&sort=created"} {
		b.Run(fmt.Sprintf("impl=keyed-mulfold/len=%d", len(key)), func(b *testing.B) {
			var s uint64
			for b.Loop() {
				s += hk.hash(key)
			}
			sinkInt64 = int64(s)
		})
		b.Run(fmt.Sprintf("impl=siphash-1-3/len=%d", len(key)), func(b *testing.B) {
			var s uint64
			for b.Loop() {
				s += sip13(1, 2, key)
			}
			sinkInt64 = int64(s)
		})
	}
}

// BenchmarkStats: one Stats call (a walk of the whole table, counting live
// buckets and locked slots) on a table of 2^20 slots, a quarter of them
// live; ns/op is the walk's cost for a million slots.
func BenchmarkStats(b *testing.B) {
	tb := benchTable(b, Policy{Limit: 1, Window: time.Hour}, WithSlots(1<<20))
	for i := range 1 << 18 {
		tb.Allow(fmt.Sprintf("key-%d", i))
	}
	b.ReportAllocs()
	for b.Loop() {
		if st := tb.Stats(); st.Keys == 0 || st.Locked != 0 {
			b.Fatalf("%+v", st)
		}
	}
}

// BenchmarkClaim is the first request of a key (a client seen once): every
// call claims a slot, one whose bucket is full again (a reclaim) or an
// empty one. The par2 variants claim on two cores at once; in the 64-slot
// table their probe windows overlap on most calls, so claims meet claims
// under way and wait for them (see Table.claim). Duplicates counts the
// claims that gave their slot back to a racing claim of the same key.
func BenchmarkClaim(b *testing.B) {
	keys := benchKeys(1 << 20)
	b.Run("impl=sharedbucket.Table", func(b *testing.B) {
		tb := benchTable(b, neverDeny, WithSlots(1<<12))
		allowEach(b, tb, keys)
	})
	for _, slots := range []int{1 << 12, 64} {
		b.Run(fmt.Sprintf("impl=sharedbucket.Table-par2/slots=%d", slots), func(b *testing.B) {
			tb := benchTable(b, neverDeny, WithSlots(slots))
			b.ReportAllocs()
			par2(b, func(id int, pb *testing.PB) {
				i := id * len(keys) / 2
				for pb.Next() {
					tb.Allow(keys[i])
					if i++; i == len(keys) {
						i = 0
					}
				}
			})
			st := tb.Stats()
			b.ReportMetric(float64(st.Contended), "failopens")
			b.ReportMetric(float64(st.Duplicates), "duplicates")
		})
	}
}
