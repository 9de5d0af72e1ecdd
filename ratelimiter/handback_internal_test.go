package ratelimiter

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/queue"
)

// TestHandBackLaterIsWorthLess: a grant handed back some time after it was
// made (on real time, the caller noticed its ended ctx microseconds after
// the grant) is worth less by what the bucket accrued meanwhile, and
// nothing once SetRate or SetBurst came in between; at its own instant it
// is worth all of it, up to a full bucket, and nothing goes into a full
// one. Rate 10/s, burst 1, every
// decision under the lock, on a clock moved by hand. Without the decay,
// a token granted at 0 and handed back at 100 ms would have gone into the
// bucket beside the token accrued by then: two tokens at one instant with
// a burst of 1.
func TestHandBackLaterIsWorthLess(t *testing.T) {
	c := newStepClock()
	l, err := New(context.Background(), 10, 1, WithClock(c))
	require.NoError(t, err)
	lockedOnly(l)
	// grant takes one token the way the queue grants a waiter, and returns
	// the grant's instant; handBack gives it back the way the queue does.
	grant := func() (at time.Time) {
		l.q.Do(func(s *queue.State) {
			require.GreaterOrEqual(t, s.Avail, int64(1), "a token to grant")
			s.Avail -= 1 + l.b.Take(1)
			at = s.Now
		})
		return at
	}
	handBack := func(at time.Time) {
		l.q.Do(func(s *queue.State) { s.Avail = l.b.Return(s.Now, at, s.Avail, 1, 0) })
	}

	at0 := grant()
	c.Add(100 * time.Millisecond)
	require.True(t, l.TryAcquire(1), "the token accrued by 100 ms")
	handBack(at0) // 100 ms late: worth 1 − 1
	assert.False(t, l.TryAcquire(1), "a second token at 100 ms")
	assert.InDelta(t, 1, l.dropped(), 1e-9)

	c.Add(100 * time.Millisecond)
	at200 := grant()
	c.Add(50 * time.Millisecond)
	handBack(at200) // 50 ms late: worth 0.5, and 0.5 has accrued
	assert.InDelta(t, 1.0, l.Tokens(), 1e-9)
	assert.True(t, l.TryAcquire(1), "at 250 ms")
	assert.InDelta(t, 1.5, l.dropped(), 1e-9)

	c.Add(100 * time.Millisecond)
	at350 := grant()
	c.Add(10 * time.Millisecond)
	require.NoError(t, l.SetRate(10))
	lockedOnly(l)
	c.Add(10 * time.Millisecond)
	handBack(at350) // SetRate came in between: worth nothing
	assert.InDelta(t, 0.2, l.Tokens(), 1e-9)
	assert.InDelta(t, 2.5, l.dropped(), 1e-9)

	c.Add(80 * time.Millisecond)
	at450 := grant()
	handBack(at450) // at its own instant: all of it
	assert.InDelta(t, 1.0, l.Tokens(), 1e-9)
	assert.InDelta(t, 2.5, l.dropped(), 1e-9)

	// A bucket full already takes nothing back: burst 2 shrunk to 1 at the
	// instant of a grant, with 1 token left.
	require.NoError(t, l.SetBurst(2))
	c.Add(100 * time.Millisecond)
	require.InDelta(t, 2.0, l.Tokens(), 1e-9)
	lockedOnly(l)
	at550 := grant()
	require.NoError(t, l.SetBurst(1))
	lockedOnly(l)
	handBack(at550)
	assert.InDelta(t, 1.0, l.Tokens(), 1e-9)
	assert.InDelta(t, 3.5, l.dropped(), 1e-9)
}
