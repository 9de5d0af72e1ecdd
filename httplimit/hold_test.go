package httplimit_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/httplimit"
	"github.com/sluice-go/sluice/ratelimiter"
	"github.com/sluice-go/sluice/sched"
	"github.com/sluice-go/sluice/vclock"
)

// slowFirst serves through up, but the request to /slow waits (in its
// sched.Blocking goroutine) until release is closed, so the test decides
// when its answer lands.
type slowFirst struct {
	up      *upstream
	release chan struct{}
}

func (s slowFirst) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/slow" {
		<-s.release
	}
	s.up.ServeHTTP(w, r)
}

// holdLandsOnWaitingHead sets the scene of both tests below, on a transport
// at 1/s over lim's burst: the bucket is drained at 0 s (burst−1 quick
// requests, then /slow, which is forced to a 429 with Retry-After: hold),
// and while /slow is in flight request A reaches the head of the queue and
// waits on the limiter for the token due at 1 s. Then the 429 lands, at 0 s.
// It returns A's fiber and A's cancel.
func holdLandsOnWaitingHead(t *testing.T, ctx context.Context, up *upstream, c *http.Client, lim *ratelimiter.Limiter, hold string, release chan struct{}) (a *sched.Fiber, cancelA context.CancelFunc) {
	for range lim.Burst() - 1 {
		code, err := status(t, c, ctx, http.MethodGet)
		require.NoError(t, err)
		require.Equal(t, 200, code)
	}
	up.header = http.Header{"Retry-After": {hold}}
	up.force.Store(1)
	slow := sched.Go(ctx, func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://api.test/slow", nil)
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
		}
		return err
	})
	sched.Yield(ctx) // /slow takes the last token and is in flight
	actx, cancelA := context.WithCancel(ctx)
	a = sched.Go(ctx, func(context.Context) error { _, err := status(t, c, actx, http.MethodGet); return err })
	sched.Yield(ctx)
	require.Equal(t, 1, lim.Waiters(), "A waits on the limiter")
	close(release)
	require.NoError(t, slow.Wait(ctx))
	return a, cancelA
}

// TestTransportCancelDuringNewHoldKeepsToken: a request waiting on the
// limiter when a hold begins, then cancelled during that hold, takes no
// token with it: the limiter holds what it would have had the request never
// come, and the requests behind it go at the hold's end as if it never had.
// (Taking the token due at 1 s and waiting out the hold with it would let
// the cancel spend that token.)
func TestTransportCancelDuringNewHoldKeepsToken(t *testing.T) {
	virtual(t, func(ctx context.Context, vc *vclock.Clock) {
		up := newUpstream(t, vc)
		lim := limiter(t, ctx, 1, 5)
		rel := make(chan struct{})
		c := &http.Client{Transport: httplimit.Transport(inMemory{slowFirst{up, rel}}, lim)}
		a, cancelA := holdLandsOnWaitingHead(t, ctx, up, c, lim, "2", rel)
		wait := spawn(t, ctx, c, 2) // C and D queue behind A

		require.NoError(t, sched.Sleep(ctx, 1500*time.Millisecond))
		cancelA()
		assert.ErrorIs(t, a.Wait(ctx), context.Canceled)
		assert.InDelta(t, 1.5, lim.Tokens(), 1e-9, "A holds no token: 1.5 s at 1/s accrued since 0 s")

		wait()
		arrivals, codes := up.log()
		assert.Equal(t, []int{200, 200, 200, 200, 429, 200, 200}, codes, "A sent nothing")
		// Two whole tokens at 2 s: C and D both go as the hold ends.
		assert.Equal(t, []time.Duration{2 * time.Second, 2 * time.Second}, arrivals[5:])
	})
}

// TestTransportBurstAfterHold: when a hold ends, no more than the limiter's
// burst leaves at once, so an upstream whose limit is the transport's own
// refuses nothing. (A head waiting out the hold with a token already taken
// while the bucket refilled to its burst behind it would let burst+1 leave
// as the hold ended, and the upstream refuse the last.)
func TestTransportBurstAfterHold(t *testing.T) {
	virtual(t, func(ctx context.Context, vc *vclock.Clock) {
		up := newUpstream(t, vc)
		up.policy.Rate, up.policy.Burst = 1, 2
		lim := limiter(t, ctx, 1, 2)
		rel := make(chan struct{})
		c := &http.Client{Transport: httplimit.Transport(inMemory{slowFirst{up, rel}}, lim)}
		a, cancelA := holdLandsOnWaitingHead(t, ctx, up, c, lim, "10", rel)
		defer cancelA()
		wait := spawn(t, ctx, c, 2) // C and D queue behind A
		require.NoError(t, a.Wait(ctx))
		wait()
		arrivals, codes := up.log()
		assert.Equal(t, []int{200, 429, 200, 200, 200}, codes, "nothing refused after the hold")
		// A and C on the 2 tokens of a full bucket at 10 s, D on the next.
		assert.Equal(t, []time.Duration{10 * time.Second, 10 * time.Second, 11 * time.Second}, arrivals[2:])
	})
}
