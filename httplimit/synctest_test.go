package httplimit_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/httplimit"
	"github.com/sluice-go/sluice/ratelimiter"
)

// The tests in this file run the Transport's main scenario in
// testing/synctest bubbles: plain goroutines, the limiter in goroutine mode,
// time.Now and timers on the bubble's fake clock, so every instant is exact
// and nothing sleeps for real. The upstream is called in memory (inMemory):
// a loopback socket is not durably blocking, so a bubble could not tell a
// request in flight from an idle one.

// inBubble runs f in a new bubble with an upstream on the bubble's clock
// (answering 429 with Retry-After: 2 above 5/s) and a limiter of rate and
// burst made in the bubble.
func inBubble(t *testing.T, rate float64, burst int, f func(t *testing.T, up *upstream, lim *ratelimiter.Limiter)) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		up := newUpstreamSince(t, func() time.Duration { return time.Since(start) })
		lim, err := ratelimiter.New(context.Background(), rate, burst)
		require.NoError(t, err)
		t.Cleanup(func() { lim.Stop() })
		f(t, up, lim)
	})
}

// send starts a goroutine per request, in order, each one queued (durably
// blocked, or done) before the next starts, and returns a func that waits
// for them all and gives their status codes and errors.
func send(t *testing.T, c *http.Client, ctxs ...context.Context) (wait func() ([]int, []error)) {
	codes, errs := make([]int, len(ctxs)), make([]error, len(ctxs))
	var wg sync.WaitGroup
	for i, ctx := range ctxs {
		wg.Go(func() { codes[i], errs[i] = status(t, c, ctx, http.MethodGet) })
		synctest.Wait()
	}
	return func() ([]int, []error) {
		wg.Wait()
		return codes, errs
	}
}

func background(n int) []context.Context {
	ctxs := make([]context.Context, n)
	for i := range ctxs {
		ctxs[i] = context.Background()
	}
	return ctxs
}

// TestSynctestZero429s: 50 requests at once through a transport at 5/s,
// burst 5, meet an upstream that refuses anything above 5/s: not one 429,
// and the k-th reaches it at exactly max(0, k−4)·200 ms of fake time.
func TestSynctestZero429s(t *testing.T) {
	inBubble(t, 5, 5, func(t *testing.T, up *upstream, lim *ratelimiter.Limiter) {
		c := &http.Client{Transport: httplimit.Transport(inMemory{up}, lim)}
		codes, errs := send(t, c, background(50)...)()
		for k := range 50 {
			assert.NoError(t, errs[k], "request %d", k)
			assert.Equal(t, 200, codes[k], "request %d", k)
		}
		up.assertPaced(t, 50)
	})
}

// TestSynctestHoldAfter429: after a forced 429 with Retry-After: 2, no
// request reaches the upstream for exactly 2 s of fake time (none at 2 s
// less a nanosecond, five at 2 s), and the queue then goes on in order at
// the limiter's pace.
func TestSynctestHoldAfter429(t *testing.T) {
	inBubble(t, 5, 5, func(t *testing.T, up *upstream, lim *ratelimiter.Limiter) {
		up.force.Store(1)
		rt := httplimit.Transport(inMemory{up}, lim)
		c := &http.Client{Transport: rt}
		code, err := status(t, c, context.Background(), http.MethodGet)
		require.NoError(t, err)
		require.Equal(t, 429, code, "the refusal is returned to the caller, not retried")
		start := time.Now()
		assert.Equal(t, start.Add(2*time.Second), rt.Hold())

		wait := send(t, c, background(8)...)
		time.Sleep(2*time.Second - time.Nanosecond)
		synctest.Wait()
		arrivals, _ := up.log()
		assert.Len(t, arrivals, 1, "nothing before 2 s")
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		arrivals, _ = up.log()
		assert.Len(t, arrivals, 1+5, "the bucket's 5 at 2 s")

		codes, errs := wait()
		for k := range 8 {
			assert.NoError(t, errs[k])
			assert.Equal(t, 200, codes[k])
		}
		up.assertHeld(t, 429)
	})
}

// TestSynctestCancelLeavesQueue: a request cancelled while it waits returns
// at the instant of the cancel, sends nothing, leaves the queue, and holds
// nothing: the one behind it goes at exactly the instant it would have had
// the cancelled one never come.
func TestSynctestCancelLeavesQueue(t *testing.T) {
	inBubble(t, 1, 1, func(t *testing.T, up *upstream, lim *ratelimiter.Limiter) {
		c := &http.Client{Transport: httplimit.Transport(inMemory{up}, lim)}
		bctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// A takes the only token; B waits on the limiter for the one due
		// at 1 s; C waits behind B, in the Transport's queue.
		wait := send(t, c, context.Background(), bctx, context.Background())
		require.Equal(t, 1, lim.Waiters(), "B waits on the limiter")

		time.Sleep(500 * time.Millisecond)
		cancel()
		synctest.Wait()
		assert.Equal(t, 1, lim.Waiters(), "C took B's place on the limiter")

		codes, errs := wait()
		assert.Equal(t, 200, codes[0])
		assert.ErrorIs(t, errs[1], context.Canceled)
		assert.Equal(t, 200, codes[2])
		arrivals, _ := up.log()
		assert.Equal(t, []time.Duration{0, time.Second}, arrivals, "B sent nothing; C went at 1 s, on the token B waited for")
		assert.Zero(t, lim.Tokens())
	})
}

// TestSynctestCancelDuringNewHold: the head of the queue waits on the
// limiter when a hold begins (a slow request's 429 lands at 0.5 s); it is
// cancelled during the hold and takes no token with it, so at the hold's
// end the bucket has what it would have had the request never come.
func TestSynctestCancelDuringNewHold(t *testing.T) {
	inBubble(t, 1, 5, func(t *testing.T, up *upstream, lim *ratelimiter.Limiter) {
		slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/slow" {
				time.Sleep(500 * time.Millisecond) // fake time: the bubble moves on
				up.force.Store(1)
			}
			up.ServeHTTP(w, r)
		})
		c := &http.Client{Transport: httplimit.Transport(inMemory{slow}, lim)}
		_, errs := send(t, c, background(4)...)()
		require.Equal(t, []error{nil, nil, nil, nil}, errs)
		var wg sync.WaitGroup
		wg.Go(func() { // takes the last token at 0 s; its 429 lands at 0.5 s
			req, _ := http.NewRequest(http.MethodGet, "http://api.test/slow", nil)
			resp, err := c.Do(req)
			if assert.NoError(t, err) {
				resp.Body.Close()
				assert.Equal(t, 429, resp.StatusCode)
			}
		})
		synctest.Wait()
		actx, cancelA := context.WithCancel(context.Background())
		defer cancelA()
		wait := send(t, c, actx, context.Background(), context.Background()) // A, then C and D
		require.Equal(t, 1, lim.Waiters(), "A waits on the limiter for the token due at 1 s")

		time.Sleep(2 * time.Second)
		cancelA()
		synctest.Wait()
		assert.InDelta(t, 2.0, lim.Tokens(), 1e-9, "2 s at 1/s, none of it taken by A")
		wg.Wait()
		codes, errs := wait()
		assert.ErrorIs(t, errs[0], context.Canceled)
		assert.Equal(t, []int{0, 200, 200}, codes)
		arrivals, upCodes := up.log()
		assert.Equal(t, []int{200, 200, 200, 200, 429, 200, 200}, upCodes, "A sent nothing")
		// The hold ends at 2.5 s with 2.5 tokens: C and D both go then.
		assert.Equal(t, []time.Duration{2500 * time.Millisecond, 2500 * time.Millisecond}, arrivals[5:])
	})
}
