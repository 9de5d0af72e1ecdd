package ratelimiter_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/ratelimiter"
	"github.com/sluice-go/sluice/sched"
	"github.com/sluice-go/sluice/sched/schedtest"
)

// A setting is the limiter's rate and burst from an instant on.
type setting struct {
	at    time.Duration
	rate  float64
	burst int
}

// settings is the history of a limiter's rate and burst, in time order,
// starting at 0. Several settings may share an instant.
type settings []setting

// integral returns the tokens accrued from 0 to t at the rates in force:
// ∫ rate over [0, t], in exact float arithmetic of the set rates.
func (h settings) integral(t time.Duration) float64 {
	sum := 0.0
	for i, s := range h {
		if s.at >= t {
			break
		}
		end := t
		if i+1 < len(h) && h[i+1].at < t {
			end = h[i+1].at
		}
		sum += s.rate * (end - s.at).Seconds()
	}
	return sum
}

// before returns the index of the setting in force just before t.
func (h settings) before(t time.Duration) int {
	i := 0
	for i+1 < len(h) && h[i+1].at < t {
		i++
	}
	return i
}

// smallAt returns the least burst in force at t: the one just before t
// and any set at t (a grant at the instant of a SetBurst may have come
// before or after it, so a call is counted as n ≤ burst only if it is
// under both).
func (h settings) smallAt(t time.Duration) int {
	i := h.before(t)
	b := h[i].burst
	for _, s := range h[i+1:] {
		if s.at > t {
			break
		}
		b = min(b, s.burst)
	}
	return b
}

// maxBurst returns the largest burst in force at any instant of [s, e]
// (the one just before s included), and the largest rate likewise.
func (h settings) maxBurst(s, e time.Duration) (burst int, rate float64) {
	i := h.before(s)
	burst, rate = h[i].burst, h[i].rate
	for _, x := range h[i+1:] {
		if x.at > e {
			break
		}
		burst, rate = max(burst, x.burst), max(rate, x.rate)
	}
	return burst, rate
}

// exploreHandBack is one schedule of a saturated limiter whose callers ask
// for up to burst + 2 tokens (so some ask for more than the burst and
// collect tokens over time), under random cancels and timeouts, random
// SetRate and SetBurst, and a Stop at a random instant. Five workers call
// Acquire back to back (someone always waits, so the bucket never sits
// full with nobody waiting, where accrual stops); a controller fiber,
// every 1 to 300 ms, cancels a random pending call, changes the rate
// (among 4, 5, 7, 10 and 20 per second) or the burst (1 to 4), or tries
// a TryAcquire, and stops the limiter at a random instant between 1 and
// 2.5 s. Checks:
//
//   - the bound: call a grant small when its n is at most the burst in
//     force at its instant (at the instant of a SetBurst, at most both the
//     old and the new one, since the grant may have come on either side).
//     For every two small grants i ≤ j, the tokens of the small grants in
//     [t_i, t_j] are at most B + ∫ rate over [t_i, t_j] + 2 ns at the
//     highest rate in force, where B is the largest burst in force at any
//     instant of [t_i, t_j] (the one just before a change at t_i
//     included), and the integral is Σ rate_k·|[t_i, t_j] ∩ span_k| over
//     the spans in which each rate was in force (2 ns: a token due between
//     two nanoseconds is credited at the later one, at either end). Windows
//     between grants are the tightest: shrinking a window to its first and
//     last small grant keeps its count and lowers its allowance;
//   - no token lost: every token granted (to any n), plus every token the
//     bucket dropped (what came back from a waiter that left, a grant
//     handed back, or a SetBurst that shrank a bucket holding more, beyond
//     what the bucket holds), plus the tokens in the bucket when the last
//     worker returned, equal the starting burst plus every token accrued,
//     ∫ rate over [0, stop], to 1e-6 (setRate keeps the fraction to the
//     ns; the bucket counts the rest as dropped);
//   - every failed Acquire returns its context's error, the error matching
//     context.DeadlineExceeded at once when it cannot be served before its
//     deadline, or ErrStopped; nobody waits after Stop.
func exploreHandBack(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x23))
	rates := []float64{4, 5, 7, 10, 20}
	stop := time.Second + time.Duration(rng.IntN(1500))*time.Millisecond + time.Duration(rng.IntN(1000))*time.Microsecond
	hist := settings{{0, rates[rng.IntN(len(rates))], 1 + rng.IntN(4)}}
	type grant struct {
		at time.Duration
		n  int
	}
	var (
		grants   []grant
		cancels  [5]context.CancelFunc // each worker's pending Acquire, if cancellable
		failures []string
		tokens   float64
		dropped  float64
		waiters  int
	)
	fail := func(format string, args ...any) { failures = append(failures, fmt.Sprintf(format, args...)) }
	err := sched.Run(context.Background(), func(ctx context.Context) error {
		l, err := ratelimiter.New(ctx, hist[0].rate, hist[0].burst)
		if err != nil {
			return err
		}
		var workers []*sched.Fiber
		for w := range cancels {
			workers = append(workers, sched.Go(ctx, func(ctx context.Context) error {
				for op := 0; ; op++ {
					n := 1 + rng.IntN(l.Burst()+2)
					cctx, cancel := ctx, context.CancelFunc(func() {})
					switch rng.IntN(3) {
					case 1:
						cctx, cancel = context.WithCancel(ctx)
						cancels[w] = cancel
					case 2:
						cctx, cancel = sched.WithTimeout(ctx, time.Duration(rng.IntN(600))*time.Millisecond)
					}
					err := l.Acquire(cctx, n)
					ctxErr := cctx.Err()
					_, hasDeadline := cctx.Deadline()
					cancel()
					cancels[w] = nil
					switch {
					case err == nil:
						grants = append(grants, grant{since(ctx), n})
					case errors.Is(err, ratelimiter.ErrStopped):
						return nil
					case ctxErr != nil && errors.Is(err, ctxErr):
					case ctxErr == nil && hasDeadline && errors.Is(err, context.DeadlineExceeded):
						// failed at once: it could not be served before its deadline
					default:
						fail("worker %d op %d: Acquire(%d): %v with ctx.Err() = %v", w, op, n, err, ctxErr)
					}
				}
			}))
		}
		act := func(ctx context.Context) error {
			switch rng.IntN(5) {
			case 0, 1:
				var pending []int
				for w, c := range cancels {
					if c != nil {
						pending = append(pending, w)
					}
				}
				if len(pending) > 0 {
					w := pending[rng.IntN(len(pending))]
					cancels[w]()
					cancels[w] = nil
				}
			case 2:
				r := rates[rng.IntN(len(rates))]
				if err := l.SetRate(r); err != nil {
					return err
				}
				hist = append(hist, setting{since(ctx), r, l.Burst()})
			case 3:
				b := 1 + rng.IntN(4)
				if err := l.SetBurst(b); err != nil {
					return err
				}
				hist = append(hist, setting{since(ctx), l.Rate(), b})
			case 4:
				if l.TryAcquire(1) {
					grants = append(grants, grant{since(ctx), 1})
				}
			}
			return nil
		}
		controller := sched.Go(ctx, func(ctx context.Context) error {
			for {
				d := time.Duration(1+rng.IntN(300)) * time.Millisecond
				if since(ctx)+d >= stop {
					if err := sched.Sleep(ctx, stop-since(ctx)); err != nil {
						return err
					}
					l.Stop()
					return nil
				}
				if err := sched.Sleep(ctx, d); err != nil {
					return err
				}
				// Up to three actions in one turn: the cancel of a head
				// grants the calls behind it at once, and a second cancel
				// in the same turn can reach one of them granted and not
				// yet resumed (its Acquire then hands the grant back).
				for range 1 + rng.IntN(3) {
					if err := act(ctx); err != nil {
						return err
					}
				}
			}
		})
		if err := controller.Wait(ctx); err != nil {
			return err
		}
		for _, w := range workers {
			if err := w.Wait(ctx); err != nil {
				return err
			}
		}
		if since(ctx) != stop {
			fail("the last worker returned at %v, want %v (the Stop)", since(ctx), stop)
		}
		tokens, dropped, waiters = l.Tokens(), ratelimiter.Dropped(l), l.Waiters()
		return nil
	}, sched.Virtual(time.Time{}), sched.WithSeed(seed))
	require.NoError(t, err)
	require.Empty(t, failures)
	require.Zero(t, waiters)

	// grants are in time order (a slice appended to as time moves on).
	var small []grant
	for _, g := range grants {
		if g.n <= hist.smallAt(g.at) {
			small = append(small, g)
		}
	}
	for i := range small {
		sum := 0
		for j := i; j < len(small); j++ {
			sum += small[j].n
			s, e := small[i].at, small[j].at
			b, r := hist.maxBurst(s, e)
			if limit := float64(b) + hist.integral(e) - hist.integral(s) + r*2e-9; float64(sum) > limit+1e-9 {
				require.Failf(t, "window bound broken", "%d tokens granted to calls of n ≤ burst in [%v, %v], at most %v allowed (burst up to %d)",
					sum, s, e, limit, b)
			}
		}
	}

	granted := 0
	for _, g := range grants {
		granted += g.n
	}
	require.InDelta(t, float64(hist[0].burst)+hist.integral(stop), float64(granted)+dropped+tokens, 1e-6,
		"granted %d, dropped %v, %v left in the bucket: tokens lost or made up", granted, dropped, tokens)
}

// The window bound for calls of n ≤ burst, and no token lost, hold in
// 1,000 schedules of callers that also ask for more than the burst, with
// cancels, timeouts, SetRate, SetBurst and Stop.
func TestExploreHandBackBound(t *testing.T) {
	schedtest.Explore(t, 1000, exploreHandBack)
}
