package lease_test

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/leasealloc"
	"github.com/sluice-go/sluice/lease"
	"github.com/sluice-go/sluice/sched"
)

// fixedServer answers every key with grant (Seq counting up, so each is
// applied) and refresh_ms refresh.
func fixedServer(grant lease.Grant, refresh int64, rpcs *int) lease.Transport {
	return lease.TransportFunc(func(_ context.Context, req *lease.Request) (*lease.Response, error) {
		*rpcs++
		resp := &lease.Response{RefreshMS: refresh}
		for _, k := range req.Keys {
			g := grant
			g.Policy, g.Key, g.Seq = k.Policy, k.Key, uint64(*rpcs)
			resp.Keys = append(resp.Keys, g)
		}
		return resp, nil
	})
}

// A grant whose numbers no server sends (a negative or NaN rate, a
// negative burst, an expiry that is not positive or wraps when made a
// Duration) is refused, not applied: applied, a negative rate or burst
// wrapped into a bucket that refilled without bound.
func TestBadGrantRefused(t *testing.T) {
	good := lease.Grant{Token: "t", Rate: 10, Burst: 5, ExpiresMS: 20_000, LimitRate: 10, LimitBurst: 5}
	for name, mod := range map[string]func(*lease.Grant){
		"negative rate":     func(g *lease.Grant) { g.Rate = -1 },
		"NaN rate":          func(g *lease.Grant) { g.Rate = math.NaN() },
		"infinite rate":     func(g *lease.Grant) { g.Rate = math.Inf(1) },
		"negative burst":    func(g *lease.Grant) { g.Burst = -1 },
		"zero expiry":       func(g *lease.Grant) { g.ExpiresMS = 0 },
		"negative expiry":   func(g *lease.Grant) { g.ExpiresMS = -1 },
		"expiry that wraps": func(g *lease.Grant) { g.ExpiresMS = math.MaxInt64/int64(time.Millisecond) + 1 },
	} {
		t.Run(name, func(t *testing.T) {
			run(t, func(ctx context.Context) error {
				var rpcs int
				bad := good
				mod(&bad)
				grant := good
				c, err := lease.NewClient(ctx, lease.TransportFunc(func(ctx context.Context, req *lease.Request) (*lease.Response, error) {
					return fixedServer(grant, 5000, &rpcs).Renew(ctx, req)
				}), lease.Options{Holder: "r"})
				require.NoError(t, err)
				b, err := c.Bucket(ctx, "p", "k")
				require.NoError(t, err)
				grant = bad
				require.NoError(t, c.Refresh(ctx))
				assert.Error(t, b.Err(), "a bad grant is an error")
				rate, burst, _ := b.Share()
				assert.Equal(t, 10.0, rate, "the good share stays")
				assert.Equal(t, int64(5), burst)
				require.NoError(t, sched.Sleep(ctx, 10*time.Second))
				got := 0
				for b.AllowN(1) {
					got++
					if got > 100 {
						break
					}
				}
				assert.Equal(t, 5, got, "the bucket holds the good share's burst")
				return nil
			})
		})
	}
}

// A refresh_ms too large for a Duration is not taken: wrapped negative,
// it made Run renew in a loop without waiting.
func TestHugeRefreshIgnored(t *testing.T) {
	run(t, func(ctx context.Context) error {
		var rpcs int
		good := lease.Grant{Token: "t", Rate: 10, Burst: 5, ExpiresMS: 20_000, LimitRate: 10, LimitBurst: 5}
		rctx, cancel := sched.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		srv := fixedServer(good, math.MaxInt64/int64(time.Millisecond)+1, &rpcs)
		c, err := lease.NewClient(ctx, lease.TransportFunc(func(ctx context.Context, req *lease.Request) (*lease.Response, error) {
			if rpcs > 100 {
				cancel() // renewing in a loop: end the test rather than hang it
			}
			return srv.Renew(ctx, req)
		}), lease.Options{Holder: "r", Refresh: time.Second})
		require.NoError(t, err)
		_, err = c.Bucket(ctx, "p", "k")
		require.NoError(t, err)
		_ = c.Run(rctx)
		assert.LessOrEqual(t, rpcs, 12, "renewals in 10 s at a 1 s refresh")
		return nil
	})
}

// A caller asking for new keys past the server's limit on keys per request
// fails those Bucket calls, but must not starve the keys already held:
// before, each refused renewal moved the next scheduled one an interval
// later, so new keys asked for more often than the refresh interval kept
// every held lease from renewing until all had expired (fail closed: every
// decision denied).
func TestNewKeysPastTheLimitDoNotStarveHeldKeys(t *testing.T) {
	a, err := leasealloc.New(leasealloc.Config{
		Policies: map[string]leasealloc.Policy{"p": {Rate: 100, Burst: 10}},
		Lease:    20 * sec, Refresh: 5 * sec, NoLearning: true, MaxKeys: 3}, t0)
	require.NoError(t, err)
	s := &server{a: a}
	run(t, func(ctx context.Context) error {
		c, err := lease.NewClient(ctx, s.transport(), lease.Options{Holder: "r"})
		require.NoError(t, err)
		var held []*lease.Bucket
		for i := range 3 {
			b, err := c.Bucket(ctx, "p", fmt.Sprint("held-", i))
			require.NoError(t, err)
			b.Want(30) // a demand, so each renewal grants a share
			held = append(held, b)
		}
		rctx, stop := context.WithCancel(ctx)
		defer stop()
		sched.Daemon(rctx, c.Run)
		for i := range 60 {
			require.NoError(t, sched.Sleep(ctx, sec))
			_, err := c.Bucket(ctx, "p", fmt.Sprint("new-", i))
			require.ErrorIs(t, err, lease.ErrTooManyKeys)
		}
		for i, b := range held {
			r, _, until := b.Share()
			assert.Positive(t, r, "held key %d: still leased after 60 s of refused new keys", i)
			assert.True(t, until.After(sched.Now(ctx)), "held key %d", i)
		}
		return nil
	})
}
