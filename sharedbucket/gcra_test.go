//go:build linux || darwin

package sharedbucket

import (
	"math"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/store"
)

// t0 is an arbitrary start for explicit-time tests: a CLOCK_MONOTONIC-like
// reading far from 0, so "full since boot" (tat 0) is also "full now".
const t0 = int64(1_000_000 * time.Second)

func TestPolicyValidation(t *testing.T) {
	for _, tc := range []struct {
		p    Policy
		want string // substring of the error; "" means valid
	}{
		{Policy{Limit: 10, Window: time.Second}, ""},
		{Policy{Limit: 10, Window: time.Second, Burst: 1}, ""},
		{Policy{Limit: 1, Window: time.Nanosecond}, ""},
		{Policy{Limit: 0, Window: time.Second}, "Policy.Limit = 0"},
		{Policy{Limit: -3, Window: time.Second}, "Policy.Limit = -3"},
		{Policy{Limit: 1, Window: 0}, "Policy.Window = 0s"},
		{Policy{Limit: 1, Window: -time.Second}, "Policy.Window = -1s"},
		{Policy{Limit: 1, Window: time.Second, Burst: -1}, "Policy.Burst = -1"},
		{Policy{Limit: 2_000_000_000, Window: time.Second}, "below 1ns per token"},
		{Policy{Limit: 1, Window: time.Hour, Burst: 1 << 40}, "overflows"},
		{Policy{Limit: 1, Window: 1<<62 - 1}, ""},
		{Policy{Limit: 1, Window: 1 << 62}, "overflows"},
		{Policy{Limit: 1, Window: time.Duration(math.MaxInt64)}, "overflows"},
		{Policy{Limit: 2, Window: 1<<62 - 1, Burst: 2}, "overflows"},
	} {
		err := tc.p.Validate()
		if tc.want == "" {
			assert.NoError(t, err, "%+v", tc.p)
			continue
		}
		if assert.Error(t, err, "%+v", tc.p) {
			assert.Contains(t, err.Error(), tc.want, "%+v", tc.p)
		}
		_, openErr := Open(t.TempDir()+"/x.sbt", tc.p)
		assert.Equal(t, err, openErr, "Open must refuse %+v with the same error", tc.p)
	}
}

func TestPolicyInterval(t *testing.T) {
	for _, tc := range []struct {
		p    Policy
		want time.Duration
	}{
		{Policy{Limit: 100, Window: time.Minute}, 600 * time.Millisecond},
		{Policy{Limit: 1000, Window: time.Second}, time.Millisecond},
		{Policy{Limit: 3, Window: time.Second}, 333_333_334}, // rounded up: tighter, never looser
		{Policy{Limit: 1, Window: time.Nanosecond}, 1},
		{Policy{Limit: 0, Window: time.Second}, 0},
	} {
		assert.Equal(t, tc.want, tc.p.Interval(), "%+v", tc.p)
	}
}

func TestOptionValidation(t *testing.T) {
	p := Policy{Limit: 1, Window: time.Second}
	dir := tmpfsDir(t)
	for _, tc := range []struct {
		opt  Option
		want string
	}{
		{WithSlots(0), "WithSlots(0)"},
		{WithSlots(MaxSlots + 1), "WithSlots(1073741825)"},
		{WithMode(0o1600), "WithMode(0o1600)"},
		{WithMode(0o400), "WithMode(0o400)"},
	} {
		_, err := Open(dir+"/x.sbt", p, tc.opt)
		if assert.Error(t, err) {
			assert.Contains(t, err.Error(), tc.want)
		}
	}
	for _, tc := range []struct{ ask, want int }{{1, 8}, {8, 8}, {9, 16}, {1000, 1024}, {1 << 16, 1 << 16}} {
		tb := openTemp(t, p, WithSlots(tc.ask))
		assert.Equal(t, tc.want, tb.Slots(), "WithSlots(%d)", tc.ask)
	}
}

// TestFormulaBoundaries checks allow, remaining, retry-after and reset-after
// one nanosecond either side of every boundary, with explicit time.
func TestFormulaBoundaries(t *testing.T) {
	p := Policy{Limit: 10, Window: time.Second} // T = 100ms, b = 10, τ = 1s
	tb := openTemp(t, p)
	const T = int64(100 * time.Millisecond)
	const tau = 10 * T
	k := "k"

	assert.Equal(t, 10.0, tb.RemainingAt(k, t0), "unknown key is full")
	assert.Equal(t, time.Duration(0), tb.RetryAfterAt(k, 1, t0))
	assert.Equal(t, time.Duration(0), tb.RetryAfterAt(k, 10, t0))
	assert.Equal(t, time.Duration(0), tb.ResetAfterAt(k, t0))

	require.True(t, tb.AllowAt(k, 1, t0))
	// tat = t0 + T
	assert.Equal(t, 9.0, tb.RemainingAt(k, t0))
	assert.Equal(t, 9.5, tb.RemainingAt(k, t0+T/2))
	assert.Equal(t, 10.0, tb.RemainingAt(k, t0+T))
	assert.Equal(t, time.Duration(T), tb.ResetAfterAt(k, t0))
	assert.Equal(t, time.Duration(1), tb.ResetAfterAt(k, t0+T-1))
	assert.Equal(t, time.Duration(0), tb.ResetAfterAt(k, t0+T))
	assert.Equal(t, time.Duration(0), tb.RetryAfterAt(k, 9, t0))
	assert.Equal(t, time.Duration(T), tb.RetryAfterAt(k, 10, t0))

	require.True(t, tb.AllowAt(k, 9, t0)) // drained: tat = t0 + τ
	assert.Equal(t, 0.0, tb.RemainingAt(k, t0))
	assert.Equal(t, time.Duration(tau), tb.ResetAfterAt(k, t0))
	assert.Equal(t, time.Duration(T), tb.RetryAfterAt(k, 1, t0))
	assert.Equal(t, time.Duration(3*T), tb.RetryAfterAt(k, 3, t0))

	// One token comes back at exactly t0+T: not a nanosecond earlier.
	assert.False(t, tb.AllowAt(k, 1, t0+T-1))
	assert.Equal(t, time.Duration(1), tb.RetryAfterAt(k, 1, t0+T-1))
	assert.True(t, tb.AllowAt(k, 1, t0+T))
	// tat = t0 + τ + T; at t0+3T exactly two tokens are back.
	assert.False(t, tb.AllowAt(k, 3, t0+3*T))
	assert.False(t, tb.AllowAt(k, 2, t0+3*T-1))
	assert.Equal(t, 2.0, tb.RemainingAt(k, t0+3*T))
	assert.True(t, tb.AllowAt(k, 2, t0+3*T))
	assert.False(t, tb.AllowAt(k, 1, t0+3*T))

	// A denial writes nothing: the state is the same after any number.
	before := tb.ResetAfterAt(k, t0+3*T)
	for range 100 {
		require.False(t, tb.AllowAt(k, 1, t0+3*T))
	}
	assert.Equal(t, before, tb.ResetAfterAt(k, t0+3*T))

	// Full again after τ of silence, and not more than full.
	later := t0 + 3*T + tau
	assert.Equal(t, 10.0, tb.RemainingAt(k, later+time.Hour.Nanoseconds()))
	assert.True(t, tb.AllowAt(k, 10, later))
	assert.False(t, tb.AllowAt(k, 1, later))
}

func TestBadInput(t *testing.T) {
	tb := openTemp(t, Policy{Limit: 10, Window: time.Second, Burst: 5})
	long := strings.Repeat("x", MaxKeyLen+1)
	maxKey := strings.Repeat("x", MaxKeyLen)
	for _, tc := range []struct {
		key  string
		cost int64
	}{
		{"", 1}, {long, 1}, {"k", 0}, {"k", -1}, {"k", 6}, {"k", math.MaxInt64}, {"k", math.MinInt64},
	} {
		assert.False(t, tb.AllowN(tc.key, tc.cost), "AllowN(%.10q, %d)", tc.key, tc.cost)
		assert.False(t, tb.AllowAt(tc.key, tc.cost, t0), "AllowAt(%.10q, %d)", tc.key, tc.cost)
		assert.Equal(t, Never, tb.RetryAfterN(tc.key, tc.cost), "RetryAfterN(%.10q, %d)", tc.key, tc.cost)
		assert.Equal(t, Never, tb.RetryAfterAt(tc.key, tc.cost, t0))
		assert.False(t, tb.Bucket(tc.key).AllowN(tc.cost))
		assert.Equal(t, Never, tb.Bucket(tc.key).RetryAfterN(tc.cost))
	}
	assert.Equal(t, 0.0, tb.Remaining(""))
	assert.Equal(t, 0.0, tb.Remaining(long))
	assert.Equal(t, 0.0, tb.Bucket("").Remaining())
	tb.Reset("")
	tb.Forget(long)
	// Times outside [0, 2^62) are refused, not wrapped.
	assert.False(t, tb.AllowAt("k", 1, -1))
	assert.False(t, tb.AllowAt("k", 1, math.MaxInt64))
	assert.Equal(t, Never, tb.RetryAfterAt("k", 1, -5))
	// Bad input is not counted and left no key behind.
	st := tb.Stats()
	assert.Zero(t, st.Allowed+st.Denied)
	assert.Zero(t, st.Keys)

	assert.True(t, tb.AllowN(maxKey, 5), "a key of exactly MaxKeyLen bytes is valid")
	assert.True(t, tb.AllowN("k", 5), "cost == burst is valid")
	assert.False(t, tb.AllowN("k", 1))
}

// TestSimulation replays the research's deterministic scenarios: one key
// polled at a fixed interval with explicit time. GCRA must allow exactly
// b + floor((D − poll)/T) — no starvation under fast polling, no loss to
// rounding — where the packed-word designs allowed 5, 685, 2583, 6010.
func TestSimulation(t *testing.T) {
	for _, tc := range []struct {
		name     string
		p        Policy
		poll     time.Duration
		duration time.Duration
		want     int64
	}{
		{"5 per 300s, poll 50ms, 1h", Policy{Limit: 5, Window: 300 * time.Second}, 50 * time.Millisecond, time.Hour, 64},
		{"5 per 300s, poll 60ms, 1h", Policy{Limit: 5, Window: 300 * time.Second}, 60 * time.Millisecond, time.Hour, 64},
		{"100 per 60s, poll 1ms, 10m", Policy{Limit: 100, Window: time.Minute}, time.Millisecond, 10 * time.Minute, 1099},
		{"100 per 60s, poll 10ms, 10m", Policy{Limit: 100, Window: time.Minute}, 10 * time.Millisecond, 10 * time.Minute, 1099},
		{"1/s b=10, poll 700ms, 1h", Policy{Limit: 1, Window: time.Second, Burst: 10}, 700 * time.Millisecond, time.Hour, 3609},
		{"2/s b=10, poll 300ms, 1h", Policy{Limit: 2, Window: time.Second, Burst: 10}, 300 * time.Millisecond, time.Hour, 7209},
		{"1000/s, poll 250µs, 60s", Policy{Limit: 1000, Window: time.Second}, 250 * time.Microsecond, time.Minute, 60999},
		{"1/s b=10, poll 100µs, 10s", Policy{Limit: 1, Window: time.Second, Burst: 10}, 100 * time.Microsecond, 10 * time.Second, 19},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := openTemp(t, tc.p, WithSlots(8))
			var allowed int64
			for now := t0; now < t0+int64(tc.duration); now += int64(tc.poll) {
				if tb.AllowAt("k", 1, now) {
					allowed++
				}
			}
			c, err := tc.p.canon()
			require.NoError(t, err)
			bound := c.burst + (int64(tc.duration)-int64(tc.poll))/c.interval
			assert.Equal(t, tc.want, bound, "the table's expected value is the bound")
			assert.Equal(t, tc.want, allowed)
		})
	}
}

// TestNoDoubleBurstAfterIdle: capacity 100 at 10/s, idle 60 s, then 1000
// requests at one instant: 100, not the 200 of a design whose fast path
// leaves the stamp stale.
func TestNoDoubleBurstAfterIdle(t *testing.T) {
	tb := openTemp(t, Policy{Limit: 10, Window: time.Second, Burst: 100})
	for range 100 {
		require.True(t, tb.AllowAt("k", 1, t0))
	}
	now := t0 + int64(60*time.Second)
	allowed := 0
	for range 1000 {
		if tb.AllowAt("k", 1, now) {
			allowed++
		}
	}
	assert.Equal(t, 100, allowed)
}

// TestNoLockoutAfterLongIdle: a drained key left alone for 30 days (or
// 300) is allowed at once; a wrapping 32-bit stamp locked it out for ~20 days.
func TestNoLockoutAfterLongIdle(t *testing.T) {
	for _, idle := range []time.Duration{30 * 24 * time.Hour, 49*24*time.Hour + 17*time.Hour, 300 * 24 * time.Hour} {
		tb := openTemp(t, Policy{Limit: 5, Window: 300 * time.Second})
		require.True(t, tb.AllowAt("k", 5, t0))
		require.False(t, tb.AllowAt("k", 1, t0+1))
		now := t0 + int64(idle)
		assert.Equal(t, 5.0, tb.RemainingAt("k", now), "idle %v", idle)
		assert.True(t, tb.AllowAt("k", 5, now), "idle %v", idle)
		assert.False(t, tb.AllowAt("k", 1, now), "idle %v: still only a burst of 5", idle)
	}
}

// TestSkew moves a stored TAT by hand (a test hook): a TAT in
// the past refills exactly, one slightly in the future (another process's
// fresher clock) never refills early, and a damaged one far in the future
// costs at most one bucket's worth of waiting.
func TestSkew(t *testing.T) {
	p := Policy{Limit: 10, Window: time.Second} // T = 100ms, τ = 1s
	const T = int64(100 * time.Millisecond)
	tb := openTemp(t, p)
	require.True(t, tb.AllowAt("k", 1, t0))
	s := tb.find(tb.hk.hash("k"))
	require.NotNil(t, s)

	// Past-dated by an hour: exactly full, exactly b.
	s.tat.Store(t0 - int64(time.Hour))
	assert.Equal(t, 10.0, tb.RemainingAt("k", t0))
	assert.True(t, tb.AllowAt("k", 10, t0))
	assert.False(t, tb.AllowAt("k", 1, t0))

	// Future-dated within τ (a peer's clock ran 300ms ahead): 7 tokens.
	s.tat.Store(t0 + 3*T)
	assert.InDelta(t, 7.0, tb.RemainingAt("k", t0), 1e-9)
	assert.False(t, tb.AllowAt("k", 8, t0))
	assert.True(t, tb.AllowAt("k", 7, t0))

	// Future-dated beyond τ but inside the slack: empty, and it stays as it is
	// (a denial writes nothing) until it comes due.
	s.tat.Store(t0 + 10*T + int64(500*time.Millisecond))
	assert.False(t, tb.AllowAt("k", 1, t0))
	assert.Equal(t, t0+10*T+int64(500*time.Millisecond), s.tat.Load())
	assert.True(t, tb.AllowAt("k", 1, t0+int64(500*time.Millisecond)+T))

	// Damaged: 10 days ahead. Reported as empty (not a 10-day wait), and
	// the first allow attempt repairs it to now+τ.
	s.tat.Store(t0 + int64(240*time.Hour))
	assert.Equal(t, 0.0, tb.RemainingAt("k", t0))
	assert.Equal(t, time.Duration(T), tb.RetryAfterAt("k", 1, t0))
	assert.False(t, tb.AllowAt("k", 1, t0))
	assert.Equal(t, t0+10*T, s.tat.Load(), "repaired to now+τ")
	assert.True(t, tb.AllowAt("k", 1, t0+T))
	// Garbage below zero reads as full.
	s.tat.Store(math.MinInt64 + 5)
	assert.Equal(t, 10.0, tb.RemainingAt("k", t0))
}

func TestBucket(t *testing.T) {
	p := Policy{Limit: 10, Window: time.Second, Burst: 4} // T = 100ms
	const T = int64(100 * time.Millisecond)
	tb := openTemp(t, p)
	b1 := tb.Bucket("hot")
	b2 := tb.Bucket("hot")
	assert.Equal(t, 4.0, b1.RemainingAt(t0))
	assert.True(t, b1.AllowAt(3, t0))
	assert.Equal(t, 1.0, b2.RemainingAt(t0), "handles on one key share one bucket")
	assert.Equal(t, 1.0, tb.RemainingAt("hot", t0), "and the Table sees it")
	assert.False(t, b2.AllowAt(2, t0))
	assert.True(t, tb.AllowAt("hot", 1, t0))
	assert.False(t, b1.AllowAt(1, t0+T-1))
	assert.True(t, b1.AllowAt(1, t0+T))

	// The slot is reclaimed by another key once the bucket is full; the
	// handle follows its key to a new slot rather than spending on another's.
	tb.Forget("hot")
	assert.True(t, tb.AllowAt("other", 4, t0+T))
	assert.True(t, b1.AllowAt(4, t0+T))
	assert.Equal(t, 0.0, tb.RemainingAt("other", t0+T))
	assert.Equal(t, 0.0, tb.RemainingAt("hot", t0+T))
	assert.False(t, b1.AllowAt(1, t0+T))

	// Live clock.
	b3 := tb.Bucket("live")
	assert.True(t, b3.AllowN(4))
	assert.False(t, b3.AllowN(1))
	assert.Greater(t, b3.RetryAfter(), time.Duration(0))
	assert.LessOrEqual(t, b3.RetryAfter(), time.Duration(T))
	assert.Less(t, b3.Remaining(), 1.0)
	st := tb.Stats()
	assert.EqualValues(t, 6, st.Allowed)
	assert.EqualValues(t, 4, st.Denied)
}

func TestLiveClock(t *testing.T) {
	tb := openTemp(t, Policy{Limit: 2, Window: time.Hour}) // T = 30min
	assert.True(t, tb.Allow("a"))
	assert.True(t, tb.AllowN("a", 1))
	assert.False(t, tb.Allow("a"))
	assert.InDelta(t, 0.0, tb.Remaining("a"), 0.001)
	ra := tb.RetryAfter("a")
	assert.Greater(t, ra, 29*time.Minute)
	assert.LessOrEqual(t, ra, 30*time.Minute)
	rs := tb.ResetAfter("a")
	assert.Greater(t, rs, 59*time.Minute)
	assert.LessOrEqual(t, rs, time.Hour)
	assert.Equal(t, Never, tb.RetryAfterN("a", 3))
	tb.Reset("a")
	assert.Equal(t, 2.0, tb.Remaining("a"))
	assert.Equal(t, time.Duration(0), tb.ResetAfter("a"))
	assert.True(t, tb.AllowN("a", 2))
	tb.Forget("a")
	assert.True(t, tb.AllowN("a", 2))
	assert.Equal(t, 1, tb.Stats().Keys)
	st := tb.Stats()
	assert.Equal(t, Stats{Limit: 2, Window: time.Hour, Burst: 2, Interval: 30 * time.Minute, Slots: DefaultSlots,
		Keys: 1, Allowed: 4, Denied: 1}, st)
}

func TestCloseDenies(t *testing.T) {
	tb, err := Open(tmpfsDir(t)+"/c.sbt", Policy{Limit: 10, Window: time.Second})
	require.NoError(t, err)
	bk := tb.Bucket("k")
	require.True(t, tb.Allow("k"))
	require.NoError(t, tb.Close())
	require.NoError(t, tb.Close(), "Close is idempotent")
	assert.False(t, tb.Allow("k"))
	assert.False(t, tb.AllowAt("k", 1, t0))
	assert.False(t, bk.AllowN(1))
	assert.Equal(t, Never, tb.RetryAfter("k"))
	assert.Equal(t, 0.0, tb.Remaining("k"))
	assert.Zero(t, tb.Stats().Keys)
}

func TestCoarseClock(t *testing.T) {
	_, err := Open(tmpfsDir(t)+"/x.sbt", fileP, WithCoarseClock(time.Microsecond))
	assert.ErrorContains(t, err, "WithCoarseClock(1µs)")

	path := tmpfsDir(t) + "/c.sbt"
	tb, err := Open(path, Policy{Limit: 2, Window: time.Hour}, WithCoarseClock(MinCoarseResolution))
	require.NoError(t, err)
	live, err := Open(path, Policy{Limit: 2, Window: time.Hour})
	require.NoError(t, err)
	defer live.Close()

	before := Now()
	first := tb.now()
	assert.LessOrEqual(t, first, before, "the coarse clock never runs ahead")
	for tb.now() == first {
		runtime.Gosched() // the refresher moves it on
	}
	assert.Greater(t, tb.now(), first)

	assert.True(t, tb.Allow("k"))
	assert.True(t, tb.Bucket("k").AllowN(1))
	assert.False(t, tb.Allow("k"))
	assert.False(t, live.Allow("k"), "a live-clock handle shares the bucket")
	assert.Greater(t, tb.RetryAfter("k"), 29*time.Minute)
	require.NoError(t, tb.Close()) // stops the refresher (goleak checks)
	assert.False(t, tb.Allow("k"))
}

// TestNoFailOpenUnderContention: two goroutines spending on one key for a
// while never exhaust the CAS retry bound (the benchmark checks the same over
// 5 × 1 s without the race detector).
func TestNoFailOpenUnderContention(t *testing.T) {
	tb := openTemp(t, neverDeny)
	done := make(chan struct{})
	for range 2 {
		go func() {
			defer func() { done <- struct{}{} }()
			bk := tb.Bucket("hot")
			for range 200_000 {
				bk.AllowN(1)
			}
		}()
	}
	<-done
	<-done
	st := tb.Stats()
	assert.EqualValues(t, 400_000, st.Allowed)
	assert.Zero(t, st.Contended)
}

// TestFailClosed: the answer given up under contention (the exit of both
// the CAS loop and the claim loop) is "no" with WithFailMode(store.FailClosed) and "yes"
// without; both are counted.
func TestFailClosed(t *testing.T) {
	open := openTemp(t, fileP)
	closed := openTemp(t, fileP, WithFailMode(store.FailClosed))
	assert.True(t, open.contended())
	assert.False(t, closed.contended())
	assert.EqualValues(t, 1, open.Stats().Contended)
	assert.EqualValues(t, 1, closed.Stats().Contended)
}
