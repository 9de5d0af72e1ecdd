package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/sched"
	"github.com/sluice-go/sluice/sched/schedtest"
	"github.com/sluice-go/sluice/semaphore"
	"github.com/sluice-go/sluice/vclock"
)

// A parked Acquire that was granted: its place in the queue and when.
type exploreGrant struct {
	arrival int
	at      time.Duration
}

type explorePark struct {
	arrival int
	n       int64
	ctx     context.Context
}

// exploreSemaphore is one schedule of a busy semaphore: workers take 1 to 4
// of 10 permits, some on a context.WithCancel that a chaos fiber cancels at
// random, some under a random sched.WithTimeout, hold them for a random
// while and give them back. The checks: no holder ever sees more than the
// size held; nobody barges past a parked waiter; nobody waits while the
// permits it needs are free (a grant or a cancellation at the head passes
// the permits on at once); parked waiters are granted
// in arrival order (a later arrival is never granted before an earlier one
// that was still waiting); a cancelled Acquire returns its context's error
// and holds nothing; at the end every permit is back and nobody waits.
func exploreSemaphore(t *testing.T, seed uint64) {
	const size, maxN = 10, 4 // permits; the most one Acquire takes
	rng := rand.New(rand.NewPCG(seed, 0xa11))
	s := semaphore.New(size)
	var (
		held     int64
		arrivals int
		grants   []exploreGrant
		cancels  []context.CancelFunc
		parked   []*explorePark // Acquire calls that parked and have not returned
		failures []string
	)
	fail := func(format string, args ...any) { failures = append(failures, fmt.Sprintf(format, args...)) }
	// check holds whenever a fiber runs. The parked calls whose context is
	// not done are, in arrival order, the granted ones (not yet resumed)
	// followed by the ones still queued: FIFO grants a prefix, and a
	// cancelled call has left the queue before any fiber runs. So the last
	// Waiters() of them are the queue, and its head must need more than is
	// free.
	check := func(where string) {
		var live []*explorePark
		for _, p := range parked {
			if p.ctx.Err() == nil {
				live = append(live, p)
			}
		}
		q := s.Waiters()
		if q > len(live) {
			fail("%s: %d waiting, only %d parked calls not cancelled", where, q, len(live))
			return
		}
		if q > 0 {
			if head := live[len(live)-q]; s.Available() >= head.n {
				fail("%s: head (arrival %d) waits for %d with %d free", where, head.arrival, head.n, s.Available())
			}
		}
	}
	err := sched.Run(context.Background(), func(ctx context.Context) error {
		now := func() time.Duration { return sched.Now(ctx).Sub(vclock.Epoch()) }
		for w := range 10 {
			sched.Go(ctx, func(ctx context.Context) error {
				for op := range 5 {
					check(fmt.Sprintf("worker %d op %d", w, op))
					n := 1 + rng.Int64N(maxN)
					cctx, cancel := ctx, context.CancelFunc(func() {})
					switch rng.IntN(3) {
					case 1:
						cctx, cancel = context.WithCancel(ctx)
						cancels = append(cancels, cancel)
					case 2:
						cctx, cancel = sched.WithTimeout(ctx, time.Duration(rng.IntN(4))*time.Millisecond)
					}
					if s.Waiters() > 0 && s.TryAcquire(1) {
						fail("worker %d op %d: TryAcquire barged past %d waiters", w, op, s.Waiters())
						s.Release(1)
					}
					ok := s.TryAcquire(n)
					if !ok {
						p := &explorePark{arrival: arrivals, n: n, ctx: cctx}
						arrivals++
						parked = append(parked, p)
						err := s.Acquire(cctx, n)
						parked = slices.DeleteFunc(parked, func(o *explorePark) bool { return o == p })
						arrival := p.arrival
						switch {
						case err == nil:
							ok = true
							grants = append(grants, exploreGrant{arrival, now()})
						case cctx.Err() == nil || !errors.Is(err, cctx.Err()):
							fail("worker %d op %d: Acquire: %v with ctx.Err() = %v", w, op, err, cctx.Err())
						}
					}
					cancel()
					if !ok {
						continue
					}
					held += n
					if held > size {
						fail("worker %d op %d: %d permits held, size %d", w, op, held, size)
					}
					if d := rng.IntN(3); d == 0 {
						sched.Yield(ctx)
					} else if err := sched.Sleep(ctx, time.Duration(d)*time.Millisecond); err != nil {
						return err
					}
					held -= n
					s.Release(n)
				}
				return nil
			})
		}
		sched.Go(ctx, func(ctx context.Context) error {
			for range 30 {
				if err := sched.Sleep(ctx, time.Duration(rng.IntN(3))*time.Millisecond); err != nil {
					return err
				}
				if len(cancels) > 0 {
					i := rng.IntN(len(cancels))
					cancels[i]()
					cancels = slices.Delete(cancels, i, i+1)
				}
			}
			return nil
		})
		return nil
	}, sched.Virtual(time.Time{}), sched.WithSeed(seed))
	require.NoError(t, err)
	require.Empty(t, failures)
	slices.SortFunc(grants, func(a, b exploreGrant) int { return a.arrival - b.arrival })
	for i := 1; i < len(grants); i++ {
		require.LessOrEqual(t, grants[i-1].at, grants[i].at,
			"arrival %d granted at %v, before arrival %d at %v: not FIFO",
			grants[i].arrival, grants[i].at, grants[i-1].arrival, grants[i-1].at)
	}
	require.Equal(t, int64(size), s.Available(), "permits lost")
	require.Zero(t, s.Waiters())
}

// FIFO, no barging and no loss over 1,000 schedules with random
// cancellations.
func TestExploreFIFOAndNoLoss(t *testing.T) {
	schedtest.Explore(t, 1000, exploreSemaphore)
}
