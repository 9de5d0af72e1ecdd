package bench_test

import (
	"context"
	"fmt"
	"testing"

	xsem "golang.org/x/sync/semaphore"

	"github.com/sluice-go/sluice/semaphore"
)

// weighted is the subset of *semaphore.Semaphore and x/sync's *Weighted
// that x/sync's own AcquireSeq benchmark uses.
type weighted interface {
	Acquire(context.Context, int64) error
	TryAcquire(int64) bool
	Release(int64)
}

// BenchmarkAcquireSeq is x/sync/semaphore's benchmark of the same name (N
// Acquire(size) then N Release(size), and the same with TryAcquire), with
// x/sync's Weighted as the same-run baseline.
func BenchmarkAcquireSeq(b *testing.B) {
	for _, c := range []struct {
		cap, size int64
		N         int
	}{
		{1, 1, 1},
		{2, 1, 1},
		{16, 1, 1},
		{128, 1, 1},
		{2, 2, 1},
		{16, 2, 8},
		{128, 2, 64},
		{2, 1, 2},
		{16, 8, 2},
		{128, 64, 2},
	} {
		for _, w := range []struct {
			name string
			w    weighted
		}{
			{"impl=sluice", semaphore.New(c.cap)},
			{"impl=xsync", xsem.NewWeighted(c.cap)},
		} {
			b.Run(fmt.Sprintf("acquire-%d-%d-%d/%s", c.cap, c.size, c.N, w.name), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					for range c.N {
						_ = w.w.Acquire(context.Background(), c.size)
					}
					for range c.N {
						w.w.Release(c.size)
					}
				}
			})
			b.Run(fmt.Sprintf("tryAcquire-%d-%d-%d/%s", c.cap, c.size, c.N, w.name), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					for range c.N {
						if !w.w.TryAcquire(c.size) {
							b.Fatalf("TryAcquire(%v) = false, want true", c.size)
						}
					}
					for range c.N {
						w.w.Release(c.size)
					}
				}
			})
		}
	}
}
