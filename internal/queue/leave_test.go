package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/queue"
	"github.com/sluice-go/sluice/sched"
)

// capSource produces the units the test puts in pending at the next Fill,
// and takes back at most up to limit free units of what comes back (a
// bucket of burst limit). Its fields are guarded by the queue's lock or
// read between calls on the one loop.
type capSource struct {
	pending  int64
	limit    int64
	returned int64 // units that came back through Return
	kept     int64 // of those, units Return kept free
}

func (s *capSource) Now() time.Time                                  { return time.Time{} }
func (s *capSource) Due(now time.Time, _, _ int64) (time.Time, bool) { return now, true }
func (s *capSource) Take(int64) int64                                { return 0 }
func (s *capSource) Fill(_ time.Time, avail, _ int64, _ bool) int64 {
	avail, s.pending = avail+s.pending, 0
	return avail
}

func (s *capSource) Return(_, _ time.Time, avail, n, _ int64) int64 {
	k := max(0, min(n, s.limit-avail))
	s.returned, s.kept = s.returned+n, s.kept+k
	return avail + k
}

// refill has q ask its Source for new units and serve the waiters, as the
// alarm does.
func refill(q *queue.Queue) { q.Do(func(*queue.State) {}) }

// TestLeaverCollectionGoesThroughReturn: a head that leaves without its
// grant hands what it had collected to the Source's Return, which decides
// what the waiters behind get, when its ctx ends and when the queue
// closes. The head asks for 3 and has collected 2; the Source keeps at
// most 1 of what comes back; so of the two callers of 1 behind it, one is
// granted at once and the other waits for the next unit. Leaving the 2
// free as they were granted both at once.
func TestLeaverCollectionGoesThroughReturn(t *testing.T) {
	run(t, func(ctx context.Context) error {
		src := &capSource{limit: 1}
		q := queue.New(queue.Config{Reason: "test", Source: src, Clock: mockClock()})
		actx, cancelA := context.WithCancel(ctx)
		a := sched.Go(ctx, func(context.Context) error { _, err := q.Acquire(actx, 3); return err })
		var granted []string
		for _, name := range []string{"B", "C"} {
			sched.Go(ctx, func(ctx context.Context) error {
				_, err := q.Acquire(ctx, 1)
				if err == nil {
					granted = append(granted, name)
				}
				return err
			})
		}
		settle(ctx)
		require.Equal(t, 3, q.Waiters())
		src.pending = 2
		refill(q)
		require.Equal(t, 3, q.Waiters(), "A collects 2 of its 3")

		cancelA()
		require.ErrorIs(t, a.Wait(ctx), context.Canceled)
		settle(ctx)
		assert.Equal(t, []string{"B"}, granted)
		assert.Equal(t, 1, q.Waiters(), "C waits for the next unit")
		assert.Equal(t, int64(2), src.returned)
		assert.Equal(t, int64(1), src.kept)
		src.pending = 1
		refill(q)
		settle(ctx)
		assert.Equal(t, []string{"B", "C"}, granted)

		// Close: the head's collection comes back through Return too.
		errClosed := errors.New("closed")
		d := sched.Go(ctx, func(ctx context.Context) error { _, err := q.Acquire(ctx, 3); return err })
		settle(ctx)
		src.pending = 2
		refill(q)
		q.Close(errClosed)
		require.ErrorIs(t, d.Wait(ctx), errClosed)
		assert.Equal(t, int64(4), src.returned)
		assert.Equal(t, int64(2), src.kept)
		assert.Equal(t, int64(1), q.Available())
		return nil
	})
}
