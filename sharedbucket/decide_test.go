//go:build linux || darwin

package sharedbucket

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDecideFigures: DecideAt's figures equal what the read-only calls
// report right after the same decision, at every boundary of
// TestFormulaBoundaries, for the Table and for a Bucket.
func TestDecideFigures(t *testing.T) {
	p := Policy{Limit: 10, Window: time.Second} // T = 100ms, b = 10
	const T = int64(100 * time.Millisecond)
	steps := []struct {
		cost, at int64
		allowed  bool
	}{
		{1, t0, true}, {9, t0, true}, {1, t0, false}, {1, t0 + T - 1, false}, {1, t0 + T, true},
		{3, t0 + 3*T, false}, {2, t0 + 3*T, true}, {1, t0 + 3*T, false}, {10, t0 + 20*T, true},
	}
	tb := openTemp(t, p)
	bk := tb.Bucket("b")
	for i, st := range steps {
		for _, tc := range []struct {
			name    string
			decide  func(n, now int64) Decision
			remain  func(now int64) float64
			retry   func(n, now int64) time.Duration
			resetAt func(now int64) time.Duration
		}{
			{"table", func(n, now int64) Decision { return tb.DecideAt("t", n, now) },
				func(now int64) float64 { return tb.RemainingAt("t", now) },
				func(n, now int64) time.Duration { return tb.RetryAfterAt("t", n, now) },
				func(now int64) time.Duration { return tb.ResetAfterAt("t", now) }},
			{"bucket", bk.DecideAt, bk.RemainingAt, bk.RetryAfterAt, bk.ResetAfterAt},
		} {
			d := tc.decide(st.cost, st.at)
			require.Equal(t, st.allowed, d.Allowed, "step %d %s", i, tc.name)
			want := Decision{Allowed: st.allowed, Remaining: tc.remain(st.at), ResetAfter: tc.resetAt(st.at)}
			if !st.allowed {
				want.RetryAfter = tc.retry(st.cost, st.at)
				assert.Positive(t, want.RetryAfter, "a denial never says retry now")
			}
			assert.Equal(t, want, d, "step %d %s", i, tc.name)
		}
	}
}

// TestDecideBadInput: a call that can never succeed says so with Never.
func TestDecideBadInput(t *testing.T) {
	tb := openTemp(t, Policy{Limit: 10, Window: time.Second, Burst: 5})
	assert.Equal(t, Decision{RetryAfter: Never}, tb.DecideN("k", 6))
	assert.Equal(t, Decision{RetryAfter: Never}, tb.DecideN("", 1))
	assert.Equal(t, Decision{RetryAfter: Never}, tb.DecideAt("k", 1, -1))
	assert.Equal(t, Decision{RetryAfter: Never}, tb.Bucket("k").DecideN(0))
	d := tb.Decide("k")
	assert.True(t, d.Allowed)
	assert.InDelta(t, 4, d.Remaining, 0.01)
	assert.InDelta(t, 100*time.Millisecond, d.ResetAfter, float64(time.Millisecond))
	d = tb.Bucket("k").Decide()
	assert.True(t, d.Allowed)
	assert.InDelta(t, 3, d.Remaining, 0.01)
	require.NoError(t, tb.Close())
	assert.Equal(t, Decision{RetryAfter: Never}, tb.Decide("k"))
	st := tb.Stats()
	assert.EqualValues(t, 2, st.Allowed)
	assert.Zero(t, st.Denied, "bad input is not counted")
}

// TestBucketGrid: a Bucket answers like the Table on the same key, call for
// call, in the X/XN/XAt grid.
func TestBucketGrid(t *testing.T) {
	tb := openTemp(t, Policy{Limit: 2, Window: time.Hour}) // T = 30min
	bk := tb.Bucket("k")
	assert.True(t, bk.Allow())
	assert.True(t, bk.AllowN(1))
	assert.False(t, bk.Allow())
	assert.False(t, tb.Allow("k"))
	assert.Equal(t, tb.RetryAfter("k").Round(time.Second), bk.RetryAfter().Round(time.Second))
	assert.Equal(t, Never, bk.RetryAfterN(3))
	assert.InDelta(t, time.Hour, bk.ResetAfter(), float64(time.Second))
	assert.InDelta(t, 0, bk.Remaining(), 0.001)
	now := Now()
	assert.Equal(t, tb.RemainingAt("k", now+int64(time.Hour)), bk.RemainingAt(now+int64(time.Hour)))
	assert.Equal(t, time.Duration(0), bk.ResetAfterAt(now+int64(2*time.Hour)))
	assert.True(t, bk.AllowAt(2, now+int64(2*time.Hour)))
}
