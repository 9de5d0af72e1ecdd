package httplimit_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/httplimit"
	"github.com/sluice-go/sluice/httplimit/httplimittest"
	"github.com/sluice-go/sluice/sched"
	"github.com/sluice-go/sluice/vclock"
)

// send1 sends one GET through rt from ctx and returns its status.
func send1(t *testing.T, ctx context.Context, rt http.RoundTripper) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://api.test/x", nil)
	require.NoError(t, err)
	resp, err := rt.RoundTrip(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// Started 10× above a quota it does not know, the Transport's limiter
// comes down to just under the quota within seconds and stays there.
func TestAdaptiveFindsTheQuota(t *testing.T) {
	virtual(t, func(ctx context.Context, vc *vclock.Clock) {
		up := httplimittest.New(httplimittest.Steps(20), httplimittest.StartAt(vc.Now()))
		lim := limiter(t, ctx, 200, 1)
		defer lim.Stop()
		rt := httplimit.Transport(up, lim, httplimit.Adaptive(1, 1000), httplimit.AdaptiveLog(nil))
		end := vc.Now().Add(2 * time.Minute)
		refused := 0
		for vc.Now().Before(end) {
			if send1(t, ctx, rt) == http.StatusTooManyRequests {
				refused++
			}
		}
		assert.InDelta(t, 20, lim.Rate(), 2, "the limiter's rate")
		assert.InDelta(t, lim.Rate(), rt.Law().Rate(), 1e-6)
		assert.Less(t, refused, 20, "429s in two minutes")
		served := int64(0)
		for _, n := range up.Served() {
			served += n
		}
		assert.Greater(t, float64(served), 0.9*20*120, "served in two minutes")
	})
}

// The rate never leaves [min, max], however far the quota is from them.
func TestAdaptiveKeepsBounds(t *testing.T) {
	for _, tc := range []struct {
		name      string
		quota     float64
		start     float64
		min, max  float64
		want      float64
		wantSlack float64
	}{
		{"quota below min", 5, 100, 50, 200, 50, 0},
		{"quota above max", 500, 10, 1, 40, 40, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			virtual(t, func(ctx context.Context, vc *vclock.Clock) {
				up := httplimittest.New(httplimittest.Steps(tc.quota), httplimittest.StartAt(vc.Now()))
				lim := limiter(t, ctx, tc.start, 1)
				defer lim.Stop()
				rt := httplimit.Transport(up, lim, httplimit.Adaptive(tc.min, tc.max), httplimit.AdaptiveLog(nil))
				end := vc.Now().Add(time.Minute)
				for vc.Now().Before(end) {
					send1(t, ctx, rt)
					require.GreaterOrEqual(t, lim.Rate(), tc.min)
					require.LessOrEqual(t, lim.Rate(), tc.max)
				}
				assert.Equal(t, tc.want, lim.Rate())
			})
		})
	}
}

// An advertised RateLimit-Policy is a ceiling: the first answer takes the
// rate down to it, and no clean run lifts it above.
func TestAdaptivePolicyIsACeiling(t *testing.T) {
	virtual(t, func(ctx context.Context, vc *vclock.Clock) {
		up := httplimittest.New(httplimittest.Steps(30), httplimittest.StartAt(vc.Now()), httplimittest.AdvertisePolicy())
		lim := limiter(t, ctx, 100, 1)
		defer lim.Stop()
		rt := httplimit.Transport(up, lim, httplimit.Adaptive(1, 1000), httplimit.AdaptiveLog(nil))
		send1(t, ctx, rt)
		assert.Equal(t, 30.0, lim.Rate())
		end := vc.Now().Add(time.Minute)
		for vc.Now().Before(end) {
			send1(t, ctx, rt)
			require.LessOrEqual(t, lim.Rate(), 30.0)
		}
	})
}

// canned answers each request with the next of its answers (the last one
// again once they run out).
type canned struct {
	codes   []int
	headers []http.Header
	i       int
}

func (c *canned) RoundTrip(req *http.Request) (*http.Response, error) {
	i := min(c.i, len(c.codes)-1)
	c.i++
	h := http.Header{}
	if c.headers[i] != nil {
		h = c.headers[i].Clone()
	}
	return &http.Response{StatusCode: c.codes[i], Header: h, Body: io.NopCloser(strings.NewReader("")), Request: req}, nil
}

// Which answers lower the rate: a 429 (with or without Retry-After), a 503
// that says when to come back, any answer whose RateLimit field says r=0.
// A 503 that says nothing, a 500, a 404 do not. Holds are as without
// Adaptive: the next request leaves when the hold ends.
func TestAdaptiveSignals(t *testing.T) {
	ra := http.Header{"Retry-After": {"1"}}
	for _, tc := range []struct {
		name string
		code int
		h    http.Header
		cut  bool
		hold time.Duration
	}{
		{"429 with Retry-After", 429, ra, true, time.Second},
		{"429 alone", 429, nil, true, 0},
		{"503 with Retry-After", 503, ra, true, time.Second},
		{"503 alone", 503, nil, false, 0},
		{"200 with RateLimit r=0", 200, http.Header{"Ratelimit": {`"q";r=0;t=1`}}, true, 0},
		{"429 with RateLimit r=0", 429, http.Header{"Ratelimit": {`"q";r=0;t=2`}}, true, 2 * time.Second},
		{"500", 500, nil, false, 0},
		{"404", 404, nil, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			virtual(t, func(ctx context.Context, vc *vclock.Clock) {
				base := &canned{codes: []int{tc.code, 200}, headers: []http.Header{tc.h, nil}}
				lim := limiter(t, ctx, 100, 1)
				defer lim.Stop()
				rt := httplimit.Transport(base, lim, httplimit.Adaptive(1, 1000), httplimit.AdaptiveLog(nil))
				start := vc.Now()
				assert.Equal(t, tc.code, send1(t, ctx, rt))
				if tc.cut {
					assert.Equal(t, int64(1), rt.Law().Cuts())
					assert.Equal(t, 50.0, lim.Rate(), "the first cut halves")
				} else {
					assert.Equal(t, int64(0), rt.Law().Cuts())
					assert.Equal(t, 100.0, lim.Rate())
				}
				send1(t, ctx, rt)
				assert.GreaterOrEqual(t, sched.Now(ctx).Sub(start), tc.hold, "the hold still holds")
			})
		})
	}
}

// Without SetRate there is nothing to drive: the option does nothing.
// Bounds that leave no rate are a programming error.
func TestAdaptiveMisuse(t *testing.T) {
	rt := httplimit.Transport(nil, acquireOnly{}, httplimit.Adaptive(1, 10))
	assert.Nil(t, rt.Law())
	virtual(t, func(ctx context.Context, vc *vclock.Clock) {
		lim := limiter(t, ctx, 10, 1)
		defer lim.Stop()
		assert.PanicsWithValue(t, "httplimit: adapt: bad bounds: min 10, max 1: want 0 < min ≤ max", func() {
			httplimit.Transport(nil, lim, httplimit.Adaptive(10, 1))
		})
		assert.Panics(t, func() { httplimit.Transport(nil, lim, httplimit.Adaptive(0, 0)) })
	})
}

type acquireOnly struct{}

func (acquireOnly) Acquire(ctx context.Context, n int) error { return ctx.Err() }

// With Adaptive and AdaptToPolicy together the law alone sets the rate: an
// advertised policy far below min is a ceiling the law clamps to min, never
// a direct write. One answer with q=1;w=1000 left the limiter at 0.001/s for
// good while the law reported 10 (5 requests in 10 minutes).
func TestAdaptiveWithPolicyKeepsBounds(t *testing.T) {
	virtual(t, func(ctx context.Context, vc *vclock.Clock) {
		base := &canned{codes: []int{200, 200}, headers: []http.Header{{"Ratelimit-Policy": {`"p";q=1;w=1000`}}, nil}}
		for _, start := range []float64{10, 50} {
			lim := limiter(t, ctx, start, 1)
			rt := httplimit.Transport(base, lim, httplimit.Adaptive(10, 100), httplimit.AdaptToPolicy(), httplimit.AdaptiveLog(nil))
			end := vc.Now().Add(10 * time.Minute)
			n := 0
			for vc.Now().Before(end) {
				send1(t, ctx, rt)
				n++
				require.GreaterOrEqual(t, lim.Rate(), 10.0, "after %d requests", n)
				require.LessOrEqual(t, lim.Rate(), 100.0)
				require.Equal(t, rt.Law().Rate(), lim.Rate(), "one owner of the rate")
			}
			assert.Equal(t, 10.0, lim.Rate(), "the ceiling, clamped to min")
			assert.GreaterOrEqual(t, n, 5990, "requests in 10 minutes at min")
			lim.Stop()
			base.i = 0
		}
	})
}

// AdaptToPolicy alone has a floor: the limiter's rate when the Transport
// was made, divided by PolicyFloorFactor. An upstream that advertises
// q=1;w=1e9 (hostile, or broken) slows the client by that factor at most,
// instead of to one request in 31 years.
func TestAdaptToPolicyFloor(t *testing.T) {
	virtual(t, func(ctx context.Context, vc *vclock.Clock) {
		base := &canned{codes: []int{200, 200}, headers: []http.Header{{"Ratelimit-Policy": {`"p";q=1;w=1000000000`}}, nil}}
		lim := limiter(t, ctx, 10, 1)
		defer lim.Stop()
		rt := httplimit.Transport(base, lim, httplimit.AdaptToPolicy())
		send1(t, ctx, rt)
		assert.Equal(t, 10.0/httplimit.PolicyFloorFactor, lim.Rate())
		end := vc.Now().Add(10 * time.Minute)
		n := 0
		for vc.Now().Before(end) {
			send1(t, ctx, rt)
			n++
		}
		assert.InDelta(t, 600*10.0/httplimit.PolicyFloorFactor, n, 1, "requests in 10 minutes at the floor")
	})
}
