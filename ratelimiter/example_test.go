package ratelimiter_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/ratelimiter"
	"github.com/sluice-go/sluice/sched"
	"github.com/sluice-go/sluice/vclock"
)

// Wrap each outbound call in Acquire: the first burst go out at once, the
// rest at the rate. Under a virtual clock the schedule is exact and costs no
// real time.
func Example() {
	err := sched.Run(context.Background(), func(ctx context.Context) error {
		limiter, err := ratelimiter.New(ctx, 5, 2) // 5 per second, bursts of 2
		if err != nil {
			return err
		}
		for i := range 5 {
			if err := limiter.Acquire(ctx, 1); err != nil {
				return err
			}
			fmt.Printf("request %d at +%v\n", i, sched.Now(ctx).Sub(vclock.Epoch()))
		}
		return nil
	}, sched.Virtual(time.Time{}))
	fmt.Println("err:", err)
	// Output:
	// request 0 at +0s
	// request 1 at +0s
	// request 2 at +200ms
	// request 3 at +400ms
	// request 4 at +600ms
	// err: <nil>
}

// Giving up on a wait you no longer need: a wait that cannot end before its
// context's deadline fails at once, with an error matching
// context.DeadlineExceeded (as x/time/rate's Wait); one that could, but is
// overtaken by its deadline, ends at the deadline. Either way the caller
// holds no token, and what the wait had collected goes back to the bucket,
// as far as a full bucket holds it.
func Example_timeout() {
	_ = sched.Run(context.Background(), func(ctx context.Context) error {
		limiter, _ := ratelimiter.New(ctx, 1, 1)
		_ = limiter.Acquire(ctx, 1) // spend the one token: the next comes at +1s
		since := func() time.Duration { return sched.Now(ctx).Sub(vclock.Epoch()) }

		wctx, cancel := sched.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		err := limiter.Acquire(wctx, 1)
		fmt.Printf("deadline +200ms: %v at +%v\n", errors.Is(err, context.DeadlineExceeded), since())

		// A waiter ahead holds the next token; ours could come at +1s only
		// if it gave up, so we wait, and our deadline ends the wait.
		sched.Go(ctx, func(ctx context.Context) error { return limiter.Acquire(ctx, 1) })
		sched.Yield(ctx)
		wctx2, cancel2 := sched.WithTimeout(ctx, 1500*time.Millisecond)
		defer cancel2()
		err = limiter.Acquire(wctx2, 1)
		fmt.Printf("deadline +1.5s: %v at +%v, waiters left: %d\n", errors.Is(err, context.DeadlineExceeded), since(), limiter.Waiters())
		return nil
	}, sched.Virtual(time.Time{}))
	// Output:
	// deadline +200ms: true at +0s
	// deadline +1.5s: true at +1.5s, waiters left: 0
}

// A batch larger than the burst: Acquire(50) on a burst of 10 at 100/s takes
// the 10 at once and collects the other 40 as they come, returning once it
// holds all 50.
func Example_batch() {
	_ = sched.Run(context.Background(), func(ctx context.Context) error {
		limiter, _ := ratelimiter.New(ctx, 100, 10)
		_ = limiter.Acquire(ctx, 50)
		fmt.Printf("batch of 50 cleared at +%v\n", sched.Now(ctx).Sub(vclock.Epoch()))
		return nil
	}, sched.Virtual(time.Time{}))
	// Output:
	// batch of 50 cleared at +400ms
}

// Testing refills under a virtual clock: one virtual millisecond of a
// 1000/s limiter buys exactly one token. sched.Advance moves time and runs
// every fiber the refill wakes before it returns, so there is nothing to
// poll and nothing to sleep. TestVirtualClockRecipe is the same as a test.
func Example_virtualClockTesting() {
	_ = sched.Run(context.Background(), func(ctx context.Context) error {
		limiter, _ := ratelimiter.New(ctx, 1000, 1)
		_ = limiter.Acquire(ctx, 1) // the initial token is free
		fmt.Println("tokens:", limiter.Tokens())

		got := false
		sched.Go(ctx, func(ctx context.Context) error {
			err := limiter.Acquire(ctx, 1)
			got = err == nil
			return err
		})
		sched.Yield(ctx) // let it reach its park
		fmt.Println("waiting:", limiter.Waiters(), "got:", got)

		_ = sched.Advance(ctx, time.Millisecond)
		fmt.Println("after 1ms got:", got)
		return nil
	}, sched.Virtual(time.Time{}))
	// Output:
	// tokens: 0
	// waiting: 1 got: false
	// after 1ms got: true
}

// TestVirtualClockRecipe is the virtual-clock recipe as a test to copy.
func TestVirtualClockRecipe(t *testing.T) {
	err := sched.Run(context.Background(), func(ctx context.Context) error {
		limiter, err := ratelimiter.New(ctx, 1000, 1)
		require.NoError(t, err)
		require.NoError(t, limiter.Acquire(ctx, 1)) // the initial token is free
		require.Equal(t, 0.0, limiter.Tokens(), "bucket empty")

		got := false
		sched.Go(ctx, func(ctx context.Context) error {
			err := limiter.Acquire(ctx, 1)
			got = err == nil
			return err
		})
		sched.Yield(ctx) // let it reach its park
		require.Equal(t, 1, limiter.Waiters())

		require.NoError(t, sched.Advance(ctx, 999*time.Microsecond))
		require.False(t, got, "no token before the millisecond is up")
		require.NoError(t, sched.Advance(ctx, time.Microsecond))
		require.True(t, got, "the second acquire was released by a refill")
		return nil
	}, sched.Virtual(time.Time{}))
	require.NoError(t, err)
}

// Outside any loop, a benbjohnson clock.Mock drives the limiter from a
// plain goroutine's test: time moves only with mock.Add.
func ExampleWithClock() {
	mock := clock.NewMock()
	limiter, _ := ratelimiter.New(context.Background(), 2, 1, ratelimiter.WithClock(mock))
	fmt.Println(limiter.TryAcquire(1), limiter.TryAcquire(1))
	mock.Add(500 * time.Millisecond)
	fmt.Println(limiter.TryAcquire(1))
	// Output:
	// true false
	// true
}
