package sched_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-go/sluice/sched"
)

// An hour of fibers, sleeps and a timeout runs in microseconds under a
// virtual clock, with exact timestamps.
func ExampleRun_virtual() {
	start := time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC)
	err := sched.Run(context.Background(), func(ctx context.Context) error {
		at := func() string { return sched.Now(ctx).Format("15:04:05") }
		worker := sched.Go(ctx, func(ctx context.Context) error {
			for i := 1; i <= 3; i++ {
				if err := sched.Sleep(ctx, 20*time.Minute); err != nil {
					return err
				}
				fmt.Println(at(), "worker finished batch", i)
			}
			return nil
		})
		tctx, cancel := sched.WithTimeout(ctx, 30*time.Minute)
		defer cancel()
		if err := worker.Wait(tctx); errors.Is(err, context.DeadlineExceeded) {
			fmt.Println(at(), "gave up waiting; the worker goes on")
		}
		return worker.Wait(ctx)
	}, sched.Virtual(start))
	fmt.Println("err:", err)
	// Output:
	// 09:20:00 worker finished batch 1
	// 09:30:00 gave up waiting; the worker goes on
	// 09:40:00 worker finished batch 2
	// 10:00:00 worker finished batch 3
	// err: <nil>
}

// A deadlock under a virtual clock is reported, never a hang.
func ExampleDeadlockError() {
	err := sched.Run(context.Background(), func(ctx context.Context) error {
		var nobody sched.Waiter
		nobody.Reason = "a reply that never comes"
		nobody.Prepare(ctx)
		return nobody.Wait(ctx)
	}, sched.Virtual(time.Time{}))
	var dl *sched.DeadlockError
	if errors.As(err, &dl) {
		fmt.Println(len(dl.Parked), "parked:", dl.Parked[0].Reason)
	}
	// Output:
	// 1 parked: a reply that never comes
}
