package httplimittest_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/httplimit/httplimittest"
	"github.com/sluice-go/sluice/sched"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func code(t *testing.T, ctx context.Context, u *httplimittest.Upstream) (int, http.Header) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://up.test/", nil)
	require.NoError(t, err)
	resp, err := u.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}

// The bucket starts full (burst), refills at the quota in force, answers
// 429 with Retry-After in whole seconds rounded up when empty, and counts
// both kinds of answer in their slot of time.
func TestUpstreamQuotaOnSchedule(t *testing.T) {
	require.NoError(t, sched.Run(context.Background(), func(ctx context.Context) error {
		u := httplimittest.New(httplimittest.Steps(10, httplimittest.Step{At: 2 * time.Second, Rate: 2}),
			httplimittest.Burst(3), httplimittest.StartAt(sched.Now(ctx)), httplimittest.AdvertisePolicy())
		for range 3 {
			c, h := code(t, ctx, u)
			assert.Equal(t, http.StatusOK, c)
			assert.Equal(t, `"quota";q=10;w=1`, h.Get("RateLimit-Policy"))
		}
		c, h := code(t, ctx, u)
		assert.Equal(t, http.StatusTooManyRequests, c)
		assert.Equal(t, "1", h.Get("Retry-After"), "100 ms rounded up")
		require.NoError(t, sched.Sleep(ctx, 100*time.Millisecond))
		c, _ = code(t, ctx, u)
		assert.Equal(t, http.StatusOK, c, "one token a tenth of a second")

		require.NoError(t, sched.Sleep(ctx, 2*time.Second)) // past the step: 2 a second, the bucket full again
		for range 3 {
			c, _ := code(t, ctx, u)
			assert.Equal(t, http.StatusOK, c)
		}
		c, h = code(t, ctx, u)
		assert.Equal(t, http.StatusTooManyRequests, c)
		assert.Equal(t, `"quota";q=2;w=1`, h.Get("RateLimit-Policy"))
		require.NoError(t, sched.Sleep(ctx, 400*time.Millisecond))
		c, _ = code(t, ctx, u)
		assert.Equal(t, http.StatusTooManyRequests, c, "half a second a token now")
		require.NoError(t, sched.Sleep(ctx, 100*time.Millisecond))
		c, _ = code(t, ctx, u)
		assert.Equal(t, http.StatusOK, c)

		served, refused := u.Served(), u.Refused()
		assert.Equal(t, int64(3), served[0])
		assert.Equal(t, int64(1), refused[0])
		var s, r int64
		for i := range served {
			s, r = s+served[i], r+refused[i]
		}
		assert.Equal(t, int64(8), s)
		assert.Equal(t, int64(3), r)
		assert.Equal(t, 100*time.Millisecond, u.Resolution())
		return nil
	}, sched.Virtual(time.Time{})))
}
