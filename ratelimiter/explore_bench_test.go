package ratelimiter_test

import (
	"testing"

	"github.com/sluice-go/sluice/sched"
)

// The cost of schedule exploration on the 100-fiber limiter run of
// TestExploreExactSchedule: one run per op, FIFO (the baseline) against a
// seeded schedule (a new seed each run, as Explore does).
//
//	go test -run '^$' -bench 'ExploreLimiter100Fibers' -count 5 ./ratelimiter
func BenchmarkExploreLimiter100Fibers(b *testing.B) {
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
				var opts []sched.Option
				if seeded {
					opts = append(opts, sched.WithSeed(seed))
				}
				if _, err := runSchedule(seed, opts...); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
