package ratelimiter_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/ratelimiter"
	"github.com/sluice-go/sluice/sched"
	"github.com/sluice-go/sluice/sched/schedtest"
)

// scheduleCall is one Acquire of the 100-fiber schedule: its place in the
// order of arrival, its tokens, its timeout if it has one, and when and how
// it returned.
type scheduleCall struct {
	arrival, n int
	timeout    time.Duration // 0: none
	at         time.Duration
	err        error
}

const (
	scheduleFibers = 100
	scheduleRate   = 10
	scheduleBurst  = 5
)

// runSchedule has 100 fibers each take 1 to 3 tokens at the same instant
// from a limiter of 10 tokens per second and a burst of 5; about one in four
// gives up after a timeout of a multiple of 50 ms (so half of the timeouts
// fall on the instant of a token). Sizes and timeouts are drawn from seed.
// It returns the calls in order of arrival.
func runSchedule(seed uint64, opts ...sched.Option) ([]scheduleCall, error) {
	rng := rand.New(rand.NewPCG(seed, 0x5c4ed))
	calls := make([]scheduleCall, 0, scheduleFibers)
	err := sched.Run(context.Background(), func(ctx context.Context) error {
		l, err := ratelimiter.New(ctx, scheduleRate, scheduleBurst)
		if err != nil {
			return err
		}
		for range scheduleFibers {
			c := scheduleCall{n: 1 + rng.IntN(3)}
			if rng.IntN(4) == 0 {
				c.timeout = time.Duration(1+rng.IntN(80)) * 50 * time.Millisecond
			}
			sched.Go(ctx, func(ctx context.Context) error {
				c.arrival = len(calls) // Acquire returns or parks before any other fiber runs
				calls = append(calls, c)
				cctx, cancel := ctx, context.CancelFunc(func() {})
				if c.timeout > 0 {
					cctx, cancel = sched.WithTimeout(ctx, c.timeout)
				}
				defer cancel()
				err := l.Acquire(cctx, c.n)
				calls[c.arrival].at, calls[c.arrival].err = since(ctx), err
				return nil
			})
		}
		return nil
	}, append(opts, sched.Virtual(time.Time{}))...)
	return calls, err
}

// exploreSchedule is one schedule of runSchedule. Whatever order the fibers
// reach Acquire in, and whichever of a grant and a timeout due at the same
// instant comes first, every call ends at the exact instant the model of a
// FIFO token bucket that hands back what a leaver collected gives:
//   - a granted call when the tokens credited so far (the burst, plus one
//     every 100 ms) cover its own tokens and those of every granted call
//     that arrived before it, and not before every call ahead of it that
//     timed out has left the queue;
//   - a timed-out call at its deadline, which was not after the instant the
//     model would have granted it; or at once, without queueing, if the
//     limiter can tell that it could not be served before its deadline
//     (DESIGN: a wait that cannot end before the deadline fails at once),
//     which it could not.
//
// Tokens lost with a leaver would delay every later grant; tokens made up
// would advance one.
func exploreSchedule(t *testing.T, seed uint64) {
	calls, err := runSchedule(seed, sched.WithSeed(seed))
	require.NoError(t, err)
	require.Len(t, calls, scheduleFibers)
	tokenAt := func(demand int) time.Duration {
		return time.Duration(max(0, demand-scheduleBurst)) * time.Second / scheduleRate
	}
	demand := 0
	var leftAt time.Duration // the latest timeout so far in arrival order
	for _, c := range calls {
		grantAt := max(tokenAt(demand+c.n), leftAt)
		if c.err == nil {
			demand += c.n
			require.Equal(t, grantAt, c.at, "arrival %d (n=%d, %d tokens granted so far)", c.arrival, c.n, demand)
			continue
		}
		require.ErrorIs(t, c.err, context.DeadlineExceeded, "arrival %d", c.arrival)
		require.LessOrEqual(t, c.timeout, grantAt, "arrival %d gave up although it could have been granted in time", c.arrival)
		if c.at == 0 {
			continue // failed at once, never queued: it could not be served in time
		}
		require.Equal(t, c.timeout, c.at, "arrival %d timed out at the wrong time", c.arrival)
		leftAt = max(leftAt, c.at)
	}
}

// The exact FIFO schedule holds in 1,000 orders of arrival, with random
// timeouts.
func TestExploreExactSchedule(t *testing.T) {
	schedtest.Explore(t, 1000, exploreSchedule)
}

// exploreBound is one schedule of a saturated limiter (7 tokens per second,
// burst 4) with random cancellations: workers take 1 to 4 tokens again and
// again, some on a context.WithCancel that a chaos fiber cancels at random,
// some under a random sched.WithTimeout, until the phase ends at 1.5005 s
// (between two tokens) and cancels everything still waiting. The checks:
//   - over every window [s, e] between grants, the tokens granted are at
//     most rate·(e−s) + burst (with e−s measured to the nanosecond);
//   - hand-back: nothing is lost, so the tokens granted plus the tokens in
//     the bucket after the phase equal the burst plus every token accrued,
//     rate·1.5005 s (the bucket never filled, so it never stopped accruing);
//     a cancelled waiter's collected tokens that went nowhere would show;
//   - a failed Acquire returns its context's error (or, at once, an error
//     matching context.DeadlineExceeded when it cannot be served before its
//     deadline).
func exploreBound(t *testing.T, seed uint64) {
	const (
		rate  = 7.0
		burst = 4
		end   = 1500*time.Millisecond + 500*time.Microsecond
	)
	rng := rand.New(rand.NewPCG(seed, 0xb0))
	type grant struct {
		at time.Duration
		n  int
	}
	var (
		grants   []grant
		granted  int
		cancels  []context.CancelFunc
		failures []string
		tokens   float64
		waiters  int
	)
	fail := func(format string, args ...any) { failures = append(failures, fmt.Sprintf(format, args...)) }
	err := sched.Run(context.Background(), func(ctx context.Context) error {
		l, err := ratelimiter.New(ctx, rate, burst)
		if err != nil {
			return err
		}
		phase, endPhase := context.WithCancel(ctx)
		defer endPhase()
		var workers []*sched.Fiber
		for w := range 6 {
			workers = append(workers, sched.Go(ctx, func(ctx context.Context) error {
				for op := 0; phase.Err() == nil; op++ {
					n := 1 + rng.IntN(burst)
					cctx, cancel := phase, context.CancelFunc(func() {})
					switch rng.IntN(3) {
					case 1:
						cctx, cancel = context.WithCancel(phase)
						cancels = append(cancels, cancel)
					case 2:
						cctx, cancel = sched.WithTimeout(phase, time.Duration(rng.IntN(400))*time.Millisecond)
					}
					err := l.Acquire(cctx, n)
					ctxErr := cctx.Err()
					_, hasDeadline := cctx.Deadline()
					cancel()
					switch {
					case err == nil:
						grants = append(grants, grant{since(ctx), n})
						granted += n
					case ctxErr != nil && errors.Is(err, ctxErr):
					case ctxErr == nil && hasDeadline && errors.Is(err, context.DeadlineExceeded):
						// failed at once: it could not be served before its deadline
					default:
						fail("worker %d op %d: Acquire: %v with ctx.Err() = %v", w, op, err, ctxErr)
					}
					_ = sched.Sleep(phase, time.Duration(rng.IntN(300))*time.Millisecond)
				}
				return nil
			}))
		}
		sched.Go(ctx, func(ctx context.Context) error {
			for phase.Err() == nil {
				_ = sched.Sleep(phase, time.Duration(1+rng.IntN(100))*time.Millisecond)
				if len(cancels) > 0 {
					i := rng.IntN(len(cancels))
					cancels[i]()
					cancels = slices.Delete(cancels, i, i+1)
				}
			}
			return nil
		})
		if err := sched.Sleep(ctx, end); err != nil {
			return err
		}
		endPhase()
		for _, w := range workers {
			if err := w.Wait(ctx); err != nil {
				return err
			}
		}
		if since(ctx) != end {
			fail("the phase ended at %v, want %v", since(ctx), end)
		}
		tokens, waiters = l.Tokens(), l.Waiters()
		return nil
	}, sched.Virtual(time.Time{}), sched.WithSeed(seed))
	require.NoError(t, err)
	require.Empty(t, failures)
	require.Zero(t, waiters)
	require.InDelta(t, burst+rate*end.Seconds(), float64(granted)+tokens, 1e-6,
		"granted %d, %v left in the bucket: tokens lost or made up", granted, tokens)
	// grants are in time order (a slice appended to as time moves on). A
	// token due between two nanoseconds is credited at the later one, so a
	// window's measured length is up to 1 ns short of the real one.
	for i := range grants {
		sum := 0
		for j := i; j < len(grants); j++ {
			sum += grants[j].n
			window := grants[j].at - grants[i].at
			if limit := rate*(window+time.Nanosecond).Seconds() + burst; float64(sum) > limit {
				require.Failf(t, "window bound broken", "%d tokens granted in [%v, %v], at most %v allowed",
					sum, grants[i].at, grants[j].at, limit)
			}
		}
	}
}

// rate·window + burst and hand-back on cancel hold in 1,000 schedules.
func TestExploreWindowBoundAndHandBack(t *testing.T) {
	schedtest.Explore(t, 1000, exploreBound)
}
