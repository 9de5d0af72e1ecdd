package ratelimiter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/queue"
	"github.com/sluice-go/sluice/sched"
	"github.com/sluice-go/sluice/sched/schedtest"
)

// lockedOnly takes l's fast word away (after a Fill has held the state, so
// nothing is lost): every decision then goes through the queue's lock, as
// for a rate without a fast path. SetRate and SetBurst start a new word, so
// call it again after them.
func lockedOnly(l *Limiter) {
	l.q.Do(func(*queue.State) { l.b.fast.Store(nil) })
}

// fastLive reports whether l's fast word holds the state now (nobody waits,
// running, and the rate has a fast path).
func fastLive(l *Limiter) bool {
	f := l.b.fast.Load()
	return f != nil && f.tat.Load() != held
}

// TestFastWordOnlyForWholeIntervals: the rates with a fast word are those
// whose token interval is a whole number of ns.
func TestFastWordOnlyForWholeIntervals(t *testing.T) {
	for _, c := range []struct {
		rate  float64
		burst int64
		fast  bool
	}{
		{1, 1, true}, {0.5, 10, true}, {5, 3, true}, {10, 1, true}, {100, 1, true}, {1000, 50, true},
		{1e6, 1 << 20, true}, {1e9, 1 << 20, true}, {1e-9, 1, true},
		{3, 1, true}, {30, 5, true}, {60, 1, true}, {0.3, 4, true}, {7, 2, true}, {3e8, 1 << 20, true}, // 1/3 ns, 1/7 ns
		{7.3, 2, false}, {1e9 - 1, 1, false}, {1.0 / 3, 1, false}, // 1/73 ns; 1/999999999 ns; rate rounded to nanotokens
		{1e-9, 2, false}, // burst·T beyond the word's bounds
	} {
		f := newFastWord(uint64(c.rate*1e9+0.5), c.burst)
		require.Equal(t, c.fast, f != nil, "rate %v burst %d", c.rate, c.burst)
	}
}

// TestFastMatchesLocked drives two limiters on mock clocks through the same
// random sequence of time steps (whole intervals, one ns either side of a
// token's instant, arbitrary), TryAcquire and Acquire of 1 to burst+1
// tokens, Tokens, SetRate and SetBurst: one with its fast word, one with
// every decision under the lock. Every answer and every Tokens reading must
// be identical, and the fast word must hold the state again after each
// locked operation (Tokens, SetRate).
// matchRates: whole-ns intervals, whole 1/k ns (3/s, 30/s, 60/s, 7/s,
// 0.3/s), and ones with no fast word (7.3/s: 1/73 ns; 1/3 s rounded).
var matchRates = []float64{1, 5, 10, 100, 1000, 0.5, 250, 1e6, 1e9, 3, 30, 60, 7, 0.3, 7.3, 1.0 / 3}

func TestFastMatchesLocked(t *testing.T) {
	for _, rate := range matchRates {
		for _, burst := range []int{1, 3, 10} {
			t.Run(fmt.Sprintf("rate=%v/burst=%d", rate, burst), func(t *testing.T) {
				matchLocked(t, rate, burst, uint64(rate*1000)+uint64(burst))
			})
		}
	}
}

// stepClock is a clock.Mock whose Now is moved by Add without the mock's
// pause for timer goroutines (a millisecond of real time per Add): for a
// single goroutine and a limiter that arms no timer (nobody waits).
type stepClock struct {
	*clock.Mock
	now time.Time
}

func (c *stepClock) Now() time.Time                  { return c.now }
func (c *stepClock) Add(d time.Duration)             { c.now = c.now.Add(d) }
func newStepClock() *stepClock                       { return &stepClock{Mock: clock.NewMock(), now: time.Unix(1e9, 0)} }
func (c *stepClock) Since(t time.Time) time.Duration { return c.now.Sub(t) }

func matchLocked(t *testing.T, rate float64, burst int, seed uint64) {
	ctx := context.Background()
	fm, lm := newStepClock(), newStepClock()
	fast, err := New(ctx, rate, burst, WithClock(fm))
	require.NoError(t, err)
	locked, err := New(ctx, rate, burst, WithClock(lm))
	require.NoError(t, err)
	lockedOnly(locked)
	rng := rand.New(rand.NewPCG(seed, 13))
	curRate := rate
	period := func() time.Duration { return time.Duration(1e9 / curRate) }
	for step := range 3000 {
		var d time.Duration
		switch rng.IntN(5) {
		case 0: // stay
		case 1:
			d = time.Duration(rng.IntN(3)+1) * period()
		case 2:
			d = period() - 1
		case 3:
			d = period() + 1
		default:
			d = time.Duration(rng.Int64N(int64(3*period()) + 1))
		}
		fm.Add(d)
		lm.Add(d)
		n := 1 + rng.IntN(burst+1)
		switch op := rng.IntN(20); {
		case op < 12:
			require.Equal(t, locked.TryAcquire(n), fast.TryAcquire(n), "step %d: TryAcquire(%d)", step, n)
		case op < 15:
			// Acquire only when the tokens are there, so that neither parks.
			if locked.Tokens() >= float64(n) {
				require.NoError(t, locked.Acquire(ctx, n))
				require.NoError(t, fast.Acquire(ctx, n), "step %d: Acquire(%d)", step, n)
			}
		case op < 19:
			require.Equal(t, locked.Tokens(), fast.Tokens(), "step %d: Tokens", step)
		case rng.IntN(2) == 0:
			curRate = matchRates[rng.IntN(len(matchRates))]
			require.NoError(t, fast.SetRate(curRate))
			require.NoError(t, locked.SetRate(curRate))
			lockedOnly(locked)
		default:
			b := 1 + rng.IntN(burst+2)
			require.NoError(t, fast.SetBurst(b))
			require.NoError(t, locked.SetBurst(b))
			lockedOnly(locked)
			burst = b
		}
		if newFastWord(fast.b.nanoRate, fast.b.burst) != nil {
			require.True(t, fastLive(fast), "step %d: the fast word holds the state again", step)
		} else {
			require.False(t, fastLive(fast), "step %d: no fast path at rate %v", step, curRate)
		}
		require.False(t, fastLive(locked))
	}
	require.Equal(t, locked.Tokens(), fast.Tokens())
}

// TestFastMatchesLockedExplored: fibers Acquire (some with timeouts that
// give up while parked), TryAcquire and sleep on one limiter under a
// virtual clock at 10/s and 30/s; the trace (who got what, when) with the fast word is the
// trace with every decision under the lock, seed by seed. A TryAcquire
// that succeeds finds nobody parked (no barging), and so does an Acquire
// that returns without having waited.
func TestFastMatchesLockedExplored(t *testing.T) {
	schedtest.Explore(t, 60, func(t *testing.T, seed uint64) {
		for _, rate := range []float64{10, 30} { // a whole-ns interval, and 1/3 ns
			got, err := exploreTrace(seed, rate, false)
			require.NoError(t, err)
			want, err := exploreTrace(seed, rate, true)
			require.NoError(t, err)
			require.Equal(t, want, got, "rate %v", rate)
		}
	})
}

func exploreTrace(seed uint64, rate float64, locked bool) ([]string, error) {
	var trace []string
	err := sched.Run(context.Background(), func(ctx context.Context) error {
		l, err := New(ctx, rate, 3)
		if err != nil {
			return err
		}
		if locked {
			lockedOnly(l)
		}
		start := sched.Now(ctx)
		for f := range 12 {
			rng := rand.New(rand.NewPCG(seed, uint64(f)))
			sched.Go(ctx, func(ctx context.Context) error {
				for i := range 6 {
					if err := sched.Sleep(ctx, time.Duration(rng.IntN(4))*50*time.Millisecond); err != nil {
						return err
					}
					n := 1 + rng.IntN(4)
					at := func() time.Duration { return sched.Now(ctx).Sub(start) }
					if rng.IntN(3) == 0 {
						ok := l.TryAcquire(n)
						if ok && l.Waiters() != 0 {
							return fmt.Errorf("fiber %d: TryAcquire(%d) passed %d parked callers", f, n, l.Waiters())
						}
						trace = append(trace, fmt.Sprintf("f%d.%d try %d %v at %v", f, i, n, ok, at()))
						continue
					}
					actx, cancel := ctx, context.CancelFunc(func() {})
					if rng.IntN(3) == 0 {
						actx, cancel = sched.WithTimeout(ctx, time.Duration(1+rng.IntN(8))*50*time.Millisecond)
					}
					t0, before := at(), l.Waiters()
					err := l.Acquire(actx, n)
					cancel()
					if err == nil && at() == t0 && before != 0 {
						return fmt.Errorf("fiber %d: Acquire(%d) passed %d parked callers", f, n, before)
					}
					trace = append(trace, fmt.Sprintf("f%d.%d acquire %d %v from %v at %v", f, i, n, err, t0, at()))
				}
				return nil
			})
		}
		return nil
	}, sched.Virtual(time.Time{}), sched.WithSeed(seed))
	return trace, err
}

// TestRealClockReadings: outside a bubble the limiter reads the monotonic
// clock alone, and its readings are never behind time.Now (its origin is
// read before its epoch), with the fast word's ns and Now the same clock;
// inside a synctest bubble it reads the bubble's fake time, exactly.
func TestRealClockReadings(t *testing.T) {
	l, err := New(context.Background(), 10, 1)
	require.NoError(t, err)
	defer l.Stop()
	require.True(t, l.b.mono)
	for range 1000 {
		before := time.Now()
		now := l.b.Now()
		ns := l.b.nanos()
		after := time.Now()
		require.False(t, now.Before(before), "reading %v behind time.Now %v", now, before)
		require.LessOrEqual(t, now.Sub(after), time.Millisecond, "reading far ahead of time.Now")
		require.GreaterOrEqual(t, ns, int64(now.Sub(l.b.epoch)), "nanos is the same clock as Now, read later")
	}

	synctest.Test(t, func(t *testing.T) {
		l, err := New(t.Context(), 10, 1)
		require.NoError(t, err)
		defer l.Stop()
		require.False(t, l.b.mono, "in a bubble the monotonic clock is not the bubble's time")
		time.Sleep(time.Hour)
		require.Equal(t, int64(time.Hour), l.b.nanos())
		require.True(t, l.b.Now().Equal(l.b.epoch.Add(time.Hour)))
	})
}
