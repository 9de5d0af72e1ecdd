// Command virtualtime shows the run loop: three fibers poll a flaky
// service on their own schedules for a virtual day, one gives up on a slow
// reply with a timeout, and the whole day runs in milliseconds with exact,
// repeatable timestamps.
//
//	go run ./examples/virtualtime
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/sluice-go/sluice/sched"
)

func main() {
	wall := time.Now()
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "virtualtime:", err)
		os.Exit(1)
	}
	fmt.Printf("a virtual day took %v of wall time\n", time.Since(wall).Round(time.Microsecond))
}

// run simulates one day and writes its log to w.
func run(w io.Writer) error {
	start := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	return sched.Run(context.Background(), func(ctx context.Context) error {
		log := func(who, what string) {
			fmt.Fprintf(w, "%s  %-8s %s\n", sched.Now(ctx).Format("15:04:05"), who, what)
		}
		// slowCall answers after d of (virtual) time, unless ctx ends first.
		slowCall := func(ctx context.Context, d time.Duration) error {
			return sched.Sleep(ctx, d)
		}
		poller := func(name string, every, replyTime, timeout time.Duration, rounds int) func(context.Context) error {
			return func(ctx context.Context) error {
				for i := 1; i <= rounds; i++ {
					if err := sched.Sleep(ctx, every); err != nil {
						return err
					}
					cctx, cancel := sched.WithTimeout(ctx, timeout)
					err := slowCall(cctx, replyTime)
					cancel()
					if err != nil {
						log(name, fmt.Sprintf("round %d: gave up after %v (%v)", i, timeout, err))
						continue
					}
					log(name, fmt.Sprintf("round %d: reply after %v", i, replyTime))
				}
				return nil
			}
		}
		fibers := []*sched.Fiber{
			sched.Go(ctx, poller("hourly", time.Hour, 90*time.Second, 5*time.Minute, 3)),
			sched.Go(ctx, poller("6-hourly", 6*time.Hour, 10*time.Minute, 5*time.Minute, 4)),
			sched.Go(ctx, poller("nightly", 23*time.Hour, 30*time.Minute, time.Hour, 1)),
		}
		for _, f := range fibers {
			if err := f.Wait(ctx); err != nil {
				return err
			}
		}
		log("main", "all pollers done")
		return nil
	}, sched.Virtual(start))
}
