package lease_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-go/sluice/internal/leasealloc"
	"github.com/sluice-go/sluice/lease"
	"github.com/sluice-go/sluice/ratelimiter"
	"github.com/sluice-go/sluice/sched"
)

// Two replicas share a policy of 100 a second under leases, in virtual
// time, with the allocator in memory (in production: sluice serve over
// HTTP or gRPC). Each decides locally with a blocking FIFO Acquire.
func Example() {
	start := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	alloc, _ := leasealloc.New(leasealloc.Config{
		Policies: map[string]leasealloc.Policy{"api": {Rate: 100, Burst: 100}},
		Lease:    20 * time.Second, Refresh: 5 * time.Second, NoLearning: true}, start)
	transport := lease.TransportFunc(func(ctx context.Context, req *lease.Request) (*lease.Response, error) {
		return alloc.RenewAt(sched.Now(ctx), req)
	})
	_ = sched.Run(context.Background(), func(ctx context.Context) error {
		ctx, stop := context.WithCancel(ctx)
		defer stop()
		var admitted [2]int
		for i := range 2 {
			c, _ := lease.NewClient(ctx, transport, lease.Options{Holder: fmt.Sprint("replica-", i)})
			b, err := c.Bucket(ctx, "api", "tenant-a")
			if err != nil {
				return err
			}
			b.Want(80) // each would use 80 a second
			sched.Daemon(ctx, c.Run)
			rate, burst := b.Limit() // validated only: with Shared the bucket's share is the limit
			lim, _ := ratelimiter.New(ctx, rate, int(burst), ratelimiter.Shared(b))
			sched.Daemon(ctx, func(ctx context.Context) error {
				for lim.Acquire(ctx, 1) == nil {
					admitted[i]++
				}
				return nil
			})
		}
		_ = sched.Sleep(ctx, time.Minute)
		fmt.Println("admitted in a minute:", admitted[0]+admitted[1], "≤", 100+100*60)
		r, _ := alloc.ReservedAt(sched.Now(ctx), "api", "tenant-a")
		fmt.Println("reserved:", r)
		return nil
	}, sched.Virtual(start))
	// Output:
	// admitted in a minute: 5848 ≤ 6100
	// reserved: 100
}
