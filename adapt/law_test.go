package adapt_test

import (
	"bytes"
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/adapt"
	"github.com/sluice-go/sluice/vclock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// setter is a RateSetter that records what it was set to.
type setter struct {
	rate float64
	sets int
}

func (s *setter) Rate() float64 { return s.rate }
func (s *setter) SetRate(r float64) error {
	if !(r > 0) || math.IsInf(r, 0) {
		return errors.New("bad rate")
	}
	s.rate, s.sets = r, s.sets+1
	return nil
}

// feed reports an OK for a request every 1/rate seconds (the rate the law
// has set, read afresh each time) for d, from *now on; it returns the OKs.
func feed(a *adapt.Law, now *time.Time, d time.Duration) int {
	end := now.Add(d)
	n := 0
	for now.Before(end) {
		*now = now.Add(time.Duration(float64(time.Second) / a.Rate()))
		a.OK(*now, *now)
		n++
	}
	return n
}

func TestNewBounds(t *testing.T) {
	for _, b := range [][2]float64{{0, 10}, {-1, 10}, {10, 5}, {math.NaN(), 10}, {1, math.NaN()}, {math.Inf(1), math.Inf(1)}} {
		_, err := adapt.New(&setter{rate: 5}, b[0], b[1])
		require.ErrorIs(t, err, adapt.ErrBadBounds, "bounds %v", b)
	}
	_, err := adapt.New(&setter{rate: 5}, 1, 10, adapt.LogChanges(nil, 1))
	require.ErrorIs(t, err, adapt.ErrBadBounds, "a log factor of 1")

	s := &setter{rate: 500}
	a, err := adapt.New(s, 1, 100)
	require.NoError(t, err)
	assert.Equal(t, 100.0, a.Rate(), "a start above max is brought to max")
	assert.Equal(t, 100.0, s.rate)
	a, err = adapt.New(&setter{rate: 5}, 1, math.Inf(1))
	require.NoError(t, err)
	assert.Equal(t, 5.0, a.Rate())
}

// While every answer is clean and the callers keep up, the rate doubles
// every second from where it started (once the answers have shown, over
// their first half second or so, that the callers use it).
func TestLawRisesWhileUsed(t *testing.T) {
	s := &setter{rate: 10}
	a, err := adapt.New(s, 1, 1000)
	require.NoError(t, err)
	now := vclock.Epoch()
	feed(a, &now, 3*time.Second)
	assert.GreaterOrEqual(t, a.Rate(), 40.0, "three seconds of clean answers")
	assert.LessOrEqual(t, a.Rate(), 80.0, "at most doubled each second")
	assert.Equal(t, s.rate, a.Rate())
	feed(a, &now, 10*time.Second)
	assert.Equal(t, 1000.0, a.Rate(), "never above max")
}

// A client that uses a fraction of its rate does not climb: the rate rises
// only while answers come at half of it or more.
func TestLawIdleDoesNotRise(t *testing.T) {
	s := &setter{rate: 100}
	a, err := adapt.New(s, 1, 1000)
	require.NoError(t, err)
	now := vclock.Epoch()
	for range 60 {
		now = now.Add(time.Second)
		a.OK(now, now)
	}
	assert.Equal(t, 100.0, a.Rate())
}

// The first throttle halves the rate (nothing is measured yet); the next
// sets it just under what the upstream served between the two, which is
// its quota when the callers kept it busy.
func TestLawCutsToMeasuredRate(t *testing.T) {
	s := &setter{rate: 400}
	a, err := adapt.New(s, 1, 1000)
	require.NoError(t, err)
	now := vclock.Epoch()
	a.OK(now, now)
	now = now.Add(10 * time.Millisecond)
	a.Throttled(now, now, time.Second)
	assert.Equal(t, 200.0, a.Rate(), "the first throttle halves")
	require.Equal(t, int64(1), a.Cuts())

	// The hold, then 120 served in 1.5 s: a quota of 60 a second over the
	// 2.5 s since the cut (the bucket was empty at both throttles).
	now = now.Add(time.Second)
	for range 120 {
		now = now.Add(12500 * time.Microsecond)
		a.OK(now, now)
	}
	a.Throttled(now, now, time.Second)
	assert.InDelta(t, 0.98*120/2.5, a.Rate(), 0.01)
	assert.Equal(t, int64(2), a.Cuts())
}

// Answers to requests sent before a cut were answered by the cut: however
// many come back throttled, the rate falls once.
func TestLawIgnoresThrottlesSentBeforeTheCut(t *testing.T) {
	a, err := adapt.New(&setter{rate: 100}, 1, 1000)
	require.NoError(t, err)
	sent := vclock.Epoch()
	now := sent.Add(50 * time.Millisecond)
	a.Throttled(sent, now, 0)
	require.Equal(t, 50.0, a.Rate())
	for i := range 10 {
		a.Throttled(sent.Add(time.Duration(i)*time.Millisecond), now.Add(time.Duration(i)*time.Millisecond), 0)
	}
	// Sent at the cut's very instant (a request that left as the throttle
	// came back, before it could hold anything): in flight, answered too.
	a.Throttled(now, now.Add(20*time.Millisecond), 0)
	assert.Equal(t, 50.0, a.Rate())
	assert.Equal(t, int64(1), a.Cuts())
}

// Whatever it is told, the rate stays within [min, max] and under the
// ceiling, and the limiter always has the rate Rate reports.
func TestLawStaysInBounds(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	s := &setter{rate: 50}
	a, err := adapt.New(s, 5, 200)
	require.NoError(t, err)
	now := vclock.Epoch()
	ceiling := math.Inf(1)
	for i := range 100000 {
		now = now.Add(time.Duration(r.IntN(int(20 * time.Millisecond))))
		sent := now.Add(-time.Duration(r.IntN(int(100 * time.Millisecond))))
		switch k := r.IntN(100); {
		case k < 3:
			a.Throttled(sent, now, time.Duration(r.IntN(3))*time.Second)
		case k < 4:
			ceiling = []float64{math.Inf(1), 150, 80, 3}[r.IntN(4)]
			a.SetCeiling(ceiling)
		default:
			a.OK(sent, now)
		}
		rate := a.Rate()
		require.GreaterOrEqual(t, rate, 5.0, "step %d", i)
		require.LessOrEqual(t, rate, max(5, min(200, ceiling)), "step %d", i)
		require.Equal(t, s.rate, rate, "step %d", i)
	}
}

// An advertised ceiling takes the rate down at once and caps every rise;
// removing it lets the rate rise again.
func TestLawCeiling(t *testing.T) {
	a, err := adapt.New(&setter{rate: 100}, 1, 1000)
	require.NoError(t, err)
	a.SetCeiling(40)
	assert.Equal(t, 40.0, a.Rate())
	now := vclock.Epoch()
	feed(a, &now, 5*time.Second)
	assert.Equal(t, 40.0, a.Rate())
	a.SetCeiling(0)
	feed(a, &now, 2*time.Second)
	assert.Greater(t, a.Rate(), 100.0)
}

// A change by more than the factor is logged once; small moves are not.
func TestLawLogsChanges(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(slog.NewTextHandler(&buf, nil))
	a, err := adapt.New(&setter{rate: 100}, 1, 1000, adapt.LogChanges(l, 2))
	require.NoError(t, err)
	now := vclock.Epoch()
	a.OK(now, now)
	a.Throttled(now, now, 0) // 100 → 50: not more than a factor of 2
	assert.Empty(t, buf.String())
	a.SetCeiling(20) // 50 → 20
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 1)
	assert.Contains(t, lines[0], "from=100")
	assert.Contains(t, lines[0], "to=20")
}

// The law owns the rate: a write to the limiter that bypasses it (another
// component calling SetRate) lasts until the law's next update, which puts
// the limiter back at the law's rate, within [min, max], even on a plateau
// where the law itself does not move.
func TestLawRestoresItsRate(t *testing.T) {
	s := &setter{rate: 10}
	a, err := adapt.New(s, 10, 100)
	require.NoError(t, err)
	now := vclock.Epoch()
	feed(a, &now, time.Second)
	a.Throttled(now, now, 0) // a cut: the law is on a plateau now
	want := a.Rate()
	require.NoError(t, s.SetRate(0.001))
	now = now.Add(10 * time.Millisecond)
	a.OK(now, now)
	assert.Equal(t, want, s.rate, "an OK restores the law's rate")
	require.NoError(t, s.SetRate(1e6))
	a.SetCeiling(math.Inf(1))
	assert.Equal(t, want, s.rate, "so does a ceiling")
	require.NoError(t, s.SetRate(0.001))
	now = now.Add(10 * time.Millisecond)
	a.Throttled(now.Add(-time.Hour), now, 0) // stale: no cut, but still a look at the limiter
	assert.Equal(t, want, s.rate, "so does a throttle")
}
