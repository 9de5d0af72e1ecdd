package lease_test

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/leasealloc"
	"github.com/sluice-go/sluice/lease"
	"github.com/sluice-go/sluice/ratelimiter"
	"github.com/sluice-go/sluice/sched"
	"github.com/sluice-go/sluice/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

const sec = time.Second

// server is an allocator behind an in-memory transport that can be cut.
type server struct {
	a    *leasealloc.Allocator
	down atomic.Bool
	rpcs atomic.Int64
}

func newServer(t *testing.T, rate float64, burst int64) *server {
	a, err := leasealloc.New(leasealloc.Config{
		Policies: map[string]leasealloc.Policy{"p": {Rate: rate, Burst: burst}},
		Lease:    20 * sec, Refresh: 5 * sec, NoLearning: true}, t0)
	require.NoError(t, err)
	return &server{a: a}
}

var errDown = errors.New("server unreachable")

func (s *server) transport() lease.Transport {
	return lease.TransportFunc(func(ctx context.Context, req *lease.Request) (*lease.Response, error) {
		s.rpcs.Add(1)
		if s.down.Load() {
			return nil, errDown
		}
		return s.a.RenewAt(sched.Now(ctx), req)
	})
}

func run(t *testing.T, main func(ctx context.Context) error) {
	t.Helper()
	require.NoError(t, sched.Run(context.Background(), main, sched.Virtual(t0)))
}

// Acquire under a lease, in virtual time: one replica alone gets the whole
// policy and the limiter admits the policy's rate, at local speed (no
// renewal per decision).
func TestAcquireUnderLease(t *testing.T) {
	s := newServer(t, 100, 10)
	run(t, func(ctx context.Context) error {
		c, err := lease.NewClient(ctx, s.transport(), lease.Options{Holder: "r1"})
		require.NoError(t, err)
		b, err := c.Bucket(ctx, "p", "k")
		require.NoError(t, err)
		assert.Equal(t, int64(10), b.Burst())
		rate, burst, until := b.Share()
		assert.Equal(t, 100.0, rate)
		assert.Equal(t, int64(10), burst)
		assert.Equal(t, t0.Add(20*sec-200*time.Millisecond), until, "lease less 1% drift margin")
		assert.Zero(t, b.Remaining(), "a new share starts empty")
		rctx, stop := context.WithCancel(ctx)
		defer stop()
		sched.Daemon(rctx, c.Run)
		lim, err := ratelimiter.New(ctx, b.Rate(), int(b.Burst()), ratelimiter.Shared(b))
		require.NoError(t, err)
		defer lim.Stop()
		n := 0
		for sched.Now(ctx).Before(t0.Add(60 * sec)) {
			require.NoError(t, lim.Acquire(ctx, 1))
			n++
		}
		// 60 s at 100/s, the bucket starting empty: 6000, give or take one.
		assert.InDelta(t, 6000, n, 1)
		assert.InDelta(t, 13, s.rpcs.Load(), 1, "one renewal per 5 s, not one per decision")
		return nil
	})
}

// A second replica gets its fair share within two refresh intervals, and the
// first one's bucket is capped at its smaller share the moment it arrives.
func TestNewReplicaFairShareAndCap(t *testing.T) {
	s := newServer(t, 100, 100)
	run(t, func(ctx context.Context) error {
		c1, _ := lease.NewClient(ctx, s.transport(), lease.Options{Holder: "r1"})
		b1, err := c1.Bucket(ctx, "p", "k")
		require.NoError(t, err)
		rctx, stop := context.WithCancel(ctx)
		defer stop()
		sched.Daemon(rctx, c1.Run)
		require.NoError(t, sched.Sleep(ctx, 3*sec))
		assert.Equal(t, 100.0, b1.Remaining(), "full after a second at 100/s, capped at 100")
		joined := sched.Now(ctx)
		c2, _ := lease.NewClient(ctx, s.transport(), lease.Options{Holder: "r2"})
		b2, err := c2.Bucket(ctx, "p", "k")
		require.NoError(t, err)
		sched.Daemon(rctx, c2.Run)
		// b1 is waiting callers' worth of demand: keep it asking.
		sched.Daemon(rctx, func(ctx context.Context) error {
			for {
				b1.AllowN(1)
				b2.AllowN(1)
				if err := sched.Sleep(ctx, time.Millisecond); err != nil {
					return err
				}
			}
		})
		for {
			r1, _, _ := b1.Share()
			if r1 < 100 {
				assert.LessOrEqual(t, b1.Remaining(), 50.0, "capped at the new burst at once")
				break
			}
			require.NoError(t, sched.Sleep(ctx, 10*time.Millisecond))
		}
		for {
			if r2, _, _ := b2.Share(); r2 == 50 {
				break
			}
			require.NoError(t, sched.Sleep(ctx, 10*time.Millisecond))
		}
		assert.LessOrEqual(t, sched.Now(ctx).Sub(joined), 10*sec+20*time.Millisecond)
		return nil
	})
}

// Server unreachable: the share holds until the local expiry, then closed
// (and the zero FailMode, lease's default) grants nothing and open keeps
// the last share.
func TestFailModes(t *testing.T) {
	for _, mode := range []store.FailMode{0, store.FailClosed, store.FailOpen} {
		t.Run(mode.String(), func(t *testing.T) {
			s := newServer(t, 10, 10)
			run(t, func(ctx context.Context) error {
				c, _ := lease.NewClient(ctx, s.transport(), lease.Options{Fail: mode})
				b, err := c.Bucket(ctx, "p", "k")
				require.NoError(t, err)
				s.down.Store(true)
				rctx, stop := context.WithCancel(ctx)
				defer stop()
				sched.Daemon(rctx, c.Run)
				require.NoError(t, sched.Sleep(ctx, 19*sec))
				assert.True(t, b.AllowN(10), "the lease holds while the server is away")
				require.NoError(t, sched.Sleep(ctx, 2*sec)) // past 19.8 s
				r, _, _ := b.Share()
				if mode != store.FailOpen {
					assert.False(t, b.AllowN(1))
					assert.Zero(t, r)
				} else {
					assert.True(t, b.AllowN(10))
					assert.Equal(t, 10.0, r)
				}
				assert.Positive(t, c.Stats().Failures)
				s.down.Store(false)
				require.NoError(t, sched.Sleep(ctx, 6*sec))
				r, _, until := b.Share()
				assert.Positive(t, r, "back at the next renewal")
				assert.True(t, until.After(sched.Now(ctx).Add(10*sec)))
				return nil
			})
		})
	}
}

// A declared demand below the share lowers the share in the same renewal,
// which frees the rest for another replica at its next renewal.
func TestWantLowersShareAtOnce(t *testing.T) {
	s := newServer(t, 100, 100)
	run(t, func(ctx context.Context) error {
		c1, _ := lease.NewClient(ctx, s.transport(), lease.Options{Holder: "r1"})
		b1, _ := c1.Bucket(ctx, "p", "k")
		c2, _ := lease.NewClient(ctx, s.transport(), lease.Options{Holder: "r2"})
		b2, _ := c2.Bucket(ctx, "p", "k")
		b2.Want(70)
		r2, _, _ := b2.Share()
		assert.Zero(t, r2)
		b1.Want(20)
		require.NoError(t, sched.Sleep(ctx, sec))
		require.NoError(t, c1.Refresh(ctx))
		r1, _, _ := b1.Share()
		assert.Equal(t, 20.0, r1)
		require.NoError(t, c2.Refresh(ctx))
		r2, _, _ = b2.Share()
		assert.Equal(t, 70.0, r2)
		return nil
	})
}

func TestCloseGivesBack(t *testing.T) {
	s := newServer(t, 100, 100)
	run(t, func(ctx context.Context) error {
		c, _ := lease.NewClient(ctx, s.transport(), lease.Options{})
		b, _ := c.Bucket(ctx, "p", "k")
		require.NoError(t, c.Close(ctx))
		assert.False(t, b.AllowN(1))
		r, _ := s.a.ReservedAt(sched.Now(ctx), "p", "k")
		assert.Zero(t, r)
		_, err := c.Bucket(ctx, "p", "k")
		assert.ErrorIs(t, err, lease.ErrClosed)
		return nil
	})
}

func TestBucketErrors(t *testing.T) {
	s := newServer(t, 100, 100)
	run(t, func(ctx context.Context) error {
		c, _ := lease.NewClient(ctx, s.transport(), lease.Options{})
		_, err := c.Bucket(ctx, "nope", "k")
		assert.ErrorIs(t, err, lease.ErrUnknownPolicy)
		s.down.Store(true)
		_, err = c.Bucket(ctx, "p", "k")
		assert.ErrorIs(t, err, errDown)
		return nil
	})
	_, err := lease.NewClient(context.Background(), nil, lease.Options{})
	assert.Error(t, err)
	_, err = lease.NewClient(context.Background(), s.transport(), lease.Options{Drift: 0.7})
	assert.Error(t, err)
}

// Outside a loop the client runs on real time (or Options.Clock) and Run
// blocks a goroutine until its ctx ends.
func TestGoroutineMode(t *testing.T) {
	a, err := leasealloc.New(leasealloc.Config{
		Policies: map[string]leasealloc.Policy{"p": {Rate: 1000, Burst: 1000}},
		Lease:    sec, Refresh: time.Millisecond, NoLearning: true}, t0)
	require.NoError(t, err)
	s := &server{a: a}
	ctx, cancel := context.WithCancel(context.Background())
	tr := lease.TransportFunc(func(ctx context.Context, req *lease.Request) (*lease.Response, error) {
		return s.a.RenewAt(t0, req) // the server's time is its own
	})
	c, err := lease.NewClient(ctx, tr, lease.Options{})
	require.NoError(t, err)
	b, err := c.Bucket(ctx, "p", "k")
	require.NoError(t, err)
	b.Want(500)
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	for c.Stats().Renewals < 3 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	assert.ErrorIs(t, <-done, context.Canceled)
	assert.Equal(t, 500.0, b.Rate())
}

var _ ratelimiter.SharedBucket = (*lease.Bucket)(nil)

// A client with no keys sends nothing, and its Run parks between
// intervals instead of spinning.
func TestRunWithoutKeys(t *testing.T) {
	s := newServer(t, 100, 100)
	run(t, func(ctx context.Context) error {
		c, _ := lease.NewClient(ctx, s.transport(), lease.Options{})
		rctx, stop := context.WithCancel(ctx)
		defer stop()
		sched.Daemon(rctx, c.Run)
		require.NoError(t, sched.Sleep(ctx, 12*sec))
		assert.Zero(t, s.rpcs.Load())
		b, err := c.Bucket(ctx, "p", "k")
		require.NoError(t, err)
		require.NoError(t, sched.Sleep(ctx, 11*sec))
		assert.Equal(t, int64(3), s.rpcs.Load(), "Bucket's, then one each 5 s")
		assert.NotNil(t, b)
		return nil
	})
}

// An infinite declared demand asks for everything, and is not refused.
func TestWantInfinite(t *testing.T) {
	s := newServer(t, 100, 100)
	run(t, func(ctx context.Context) error {
		c, _ := lease.NewClient(ctx, s.transport(), lease.Options{})
		b, err := c.Bucket(ctx, "p", "k")
		require.NoError(t, err)
		b.Want(math.Inf(1))
		require.NoError(t, c.Refresh(ctx))
		require.NoError(t, b.Err())
		assert.Equal(t, 100.0, b.Rate())
		return nil
	})
}

// Outside a loop, with no Options.Clock, the client reads the monotonic
// clock alone (a base time plus monotime): its readings must still be
// time.Now's, so a lease's local expiry is the grant's length from when the
// request was sent, less the drift margin.
func TestRealClockIsTimeNow(t *testing.T) {
	a, err := leasealloc.New(leasealloc.Config{
		Policies: map[string]leasealloc.Policy{"p": {Rate: 1000, Burst: 1000}},
		Lease:    20 * sec, Refresh: 5 * sec, NoLearning: true}, t0)
	require.NoError(t, err)
	tr := lease.TransportFunc(func(ctx context.Context, req *lease.Request) (*lease.Response, error) {
		return a.RenewAt(t0, req) // the server's time is its own
	})
	ctx := context.Background()
	c, err := lease.NewClient(ctx, tr, lease.Options{})
	require.NoError(t, err)
	time.Sleep(10 * time.Millisecond) // let the clocks run apart, if they would
	before := time.Now()
	b, err := c.Bucket(ctx, "p", "k")
	after := time.Now()
	require.NoError(t, err)
	_, _, until := b.Share()
	life := 20*sec - 20*sec/100 // the lease less the default 1% margin
	assert.False(t, until.Before(before.Add(life)), "until %v before %v", until, before.Add(life))
	assert.False(t, until.After(after.Add(life)), "until %v after %v", until, after.Add(life))
}
