package sched_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-go/sluice/sched"
)

// The scheduler's own cost under a seed: 100 fibers that each yield 20 times
// and sleep 5 times, all sleeps of a round due at the same instant (so both
// the run queue and the timer ties are drawn from the seed), FIFO (the
// baseline) against seeded, one run per op.
//
//	go test -run '^$' -bench 'SeededRun' -count 5 ./sched
func BenchmarkSeededRun(b *testing.B) {
	body := func(ctx context.Context) error {
		for range 100 {
			sched.Go(ctx, func(ctx context.Context) error {
				for range 5 {
					for range 4 {
						sched.Yield(ctx)
					}
					if err := sched.Sleep(ctx, time.Millisecond); err != nil {
						return err
					}
				}
				return nil
			})
		}
		return nil
	}
	for _, seeded := range []bool{false, true} {
		name := "order=fifo"
		if seeded {
			name = "order=seeded"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			seed := uint64(0)
			for b.Loop() {
				seed++
				opts := []sched.Option{sched.Virtual(time.Time{})}
				if seeded {
					opts = append(opts, sched.WithSeed(seed))
				}
				if err := sched.Run(context.Background(), body, opts...); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
