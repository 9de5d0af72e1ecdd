package sched_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-go/sluice/sched"
)

// Exploring schedules finds a check-then-act race that FIFO order hides,
// and the seed that found it replays it. A cache fill checks the cache,
// fetches (a wait: here a Yield), then stores; a second reader does some
// work first. Under FIFO the first reader always stores before the second
// one looks. In a test, schedtest.Explore runs the seeds and prints the
// command that replays a failing one.
func ExampleWithSeed() {
	fetches := func(opts ...sched.Option) int {
		cached, n := false, 0
		read := func(ctx context.Context) {
			if !cached {
				n++
				sched.Yield(ctx) // the fetch
				cached = true
			}
		}
		_ = sched.Run(context.Background(), func(ctx context.Context) error {
			sched.Go(ctx, func(ctx context.Context) error { read(ctx); return nil })
			sched.Go(ctx, func(ctx context.Context) error {
				sched.Yield(ctx) // some work first
				read(ctx)
				return nil
			})
			return nil
		}, append(opts, sched.Virtual(time.Time{}))...)
		return n
	}

	fmt.Println("FIFO fetches:", fetches())
	for seed := uint64(1); seed <= 100; seed++ {
		if fetches(sched.WithSeed(seed)) > 1 {
			fmt.Println("a seed fetches twice: true")
			fmt.Println("replayed, it fetches:", fetches(sched.WithSeed(seed)))
			break
		}
	}
	// Output:
	// FIFO fetches: 1
	// a seed fetches twice: true
	// replayed, it fetches: 2
}
