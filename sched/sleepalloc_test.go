package sched_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/sluice-go/sluice/sched"
)

// Under a virtual clock a fiber's first Sleep allocates one object, the
// sleeper that holds its timer and its wait, and later Sleeps none: the
// allocations of fibers that sleep, less those of fibers that yield
// instead, are one per fiber plus the timer queue's chunks (a few). A
// sleeper with its own callback and timer would be three per fiber.
func TestVirtualSleepAllocatesOneObjectPerFiber(t *testing.T) {
	const fibers, sleeps = 100, 5
	run := func(wait func(ctx context.Context) error) float64 {
		return testing.AllocsPerRun(5, func() {
			err := sched.Run(context.Background(), func(ctx context.Context) error {
				for range fibers {
					sched.Go(ctx, func(ctx context.Context) error {
						for range sleeps {
							if err := wait(ctx); err != nil {
								return err
							}
						}
						return nil
					})
				}
				return nil
			}, sched.Virtual(time.Time{}))
			if err != nil {
				t.Fatal(err)
			}
		})
	}
	sleeping := run(func(ctx context.Context) error { return sched.Sleep(ctx, time.Millisecond) })
	yielding := run(func(ctx context.Context) error { sched.Yield(ctx); return nil })
	assert.LessOrEqual(t, sleeping-yielding, float64(fibers)*3/2, "sleeping %v, yielding %v allocations per run", sleeping, yielding)
}
