package httplimit_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/httplimit"
	"github.com/sluice-go/sluice/ratelimiter"
	"github.com/sluice-go/sluice/sched"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/vclock"
)

// These tests run inside a sched.Run loop on a virtual clock, so every
// instant below is exact and no test sleeps. The upstream is an
// http.Handler called in memory through inMemory, on the same virtual
// clock; the loopback path is covered by TestTransportLoopbackHold,
// examples/fetch and the Middleware tests. synctest_test.go runs the same
// scenarios with plain goroutines in testing/synctest bubbles.

// inMemory is an http.RoundTripper that serves each request with a handler
// in this process, as a server would (the handler sees its own copy).
type inMemory struct{ h http.Handler }

func (m inMemory) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := req.Context().Err(); err != nil {
		return nil, err
	}
	rec := httptest.NewRecorder()
	sreq := req.Clone(req.Context())
	sreq.RequestURI = req.URL.RequestURI()
	m.h.ServeHTTP(rec, sreq)
	if req.Body != nil {
		_ = req.Body.Close()
	}
	return rec.Result(), nil
}

// virtual runs main in a loop on a virtual clock that starts at the zero
// instant of vclock.New.
func virtual(t *testing.T, main func(ctx context.Context, vc *vclock.Clock)) {
	vc := vclock.New(time.Time{})
	require.NoError(t, sched.Run(context.Background(), func(ctx context.Context) error {
		main(ctx, vc)
		return nil
	}, sched.WithVirtualClock(vc)))
}

// upstream answers 429 with Retry-After: 2 above 5 requests a second (a
// GCRA bucket of rate 5, burst 5: the service's memory store, whose
// arithmetic is independent of ratelimiter's ticker refill), and records
// when each request arrived.
type upstream struct {
	since  func() time.Duration // time since the upstream started
	mem    *store.Memory
	force  atomic.Int64 // answer the next n requests 429 whatever the bucket says
	header http.Header  // fields of a forced 429 (default Retry-After: 2)
	policy store.Policy // the limit above which it answers 429 (default 5/s, burst 5)

	mu       sync.Mutex
	arrivals []time.Duration // since start
	codes    []int
}

func newUpstream(t *testing.T, vc *vclock.Clock) *upstream {
	start := vc.Now()
	return newUpstreamSince(t, func() time.Duration { return vc.Since(start) })
}

// newUpstreamSince is newUpstream on any clock: since tells the time since
// the upstream started (in a testing/synctest bubble, time.Since is fake).
func newUpstreamSince(t *testing.T, since func() time.Duration) *upstream {
	u := &upstream{since: since, header: http.Header{"Retry-After": {"2"}},
		policy: store.Policy{Name: "api", Rate: 5, Burst: 5}}
	u.mem = store.NewMemory(store.WithClock(func() time.Duration { return since() + time.Hour }))
	t.Cleanup(func() { _ = u.mem.Close() })
	return u
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	code := http.StatusOK
	if u.force.Load() > 0 && u.force.Add(-1) >= 0 {
		code = http.StatusTooManyRequests
		for k, v := range u.header {
			w.Header()[k] = v
		}
		if u.header.Get("X-Status") == "503" {
			code = http.StatusServiceUnavailable
		}
	} else if res, _ := u.mem.Allow(r.Context(), "k", 1, u.policy); !res.Allowed {
		code = http.StatusTooManyRequests
		w.Header().Set("Retry-After", "2")
	}
	u.mu.Lock()
	u.arrivals = append(u.arrivals, u.since())
	u.codes = append(u.codes, code)
	u.mu.Unlock()
	w.WriteHeader(code)
}

func (u *upstream) log() ([]time.Duration, []int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]time.Duration(nil), u.arrivals...), append([]int(nil), u.codes...)
}

// assertPaced checks that the upstream saw n requests, none refused, the
// k-th at exactly max(0, k−4)·200 ms: 5 at once, then one every 200 ms, the
// schedule of a limiter at 5/s, burst 5.
func (u *upstream) assertPaced(t *testing.T, n int) {
	arrivals, codes := u.log()
	require.Len(t, codes, n)
	assert.NotContains(t, codes, 429)
	for k, at := range arrivals {
		assert.Equal(t, time.Duration(max(0, k-4))*200*time.Millisecond, at, "request %d", k)
	}
}

// assertHeld checks the scene of a refusal (code, with Retry-After: 2) at
// 0 s followed by 8 requests through a transport at 5/s, burst 5: nothing
// for exactly 2 s. The refusal spent one token; by 2 s the bucket is full
// again (5): 5 go at 2 s, then one every 200 ms, in order.
func (u *upstream) assertHeld(t *testing.T, code int) {
	arrivals, codes := u.log()
	require.Len(t, arrivals, 9)
	assert.Equal(t, []int{code, 200, 200, 200, 200, 200, 200, 200, 200}, codes)
	want := []time.Duration{0, 2000, 2000, 2000, 2000, 2000, 2200, 2400, 2600}
	for i, w := range want {
		assert.Equal(t, w*time.Millisecond, arrivals[i], "request %d", i)
	}
}

func limiter(t *testing.T, ctx context.Context, rate float64, burst int) *ratelimiter.Limiter {
	l, err := ratelimiter.New(ctx, rate, burst)
	require.NoError(t, err)
	return l
}

func status(t *testing.T, c *http.Client, ctx context.Context, method string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://api.test/x", nil)
	require.NoError(t, err)
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// spawn starts n fibers, each sending one GET that must be answered 200,
// queued in spawn order, and returns a func that waits for them all.
func spawn(t *testing.T, ctx context.Context, c *http.Client, n int) (wait func()) {
	var fs []*sched.Fiber
	for i := range n {
		fs = append(fs, sched.Go(ctx, func(ctx context.Context) error {
			code, err := status(t, c, ctx, http.MethodGet)
			assert.NoError(t, err, "request %d", i)
			assert.Equal(t, 200, code, "request %d", i)
			return nil
		}))
		sched.Yield(ctx) // let it queue before the next one starts
	}
	return func() {
		for _, f := range fs {
			_ = f.Wait(ctx)
		}
	}
}

// TestTransportZero429s: 50 requests at once through a transport at 5/s,
// burst 5, meet a server that refuses anything above 5/s: not one 429, and
// the schedule is the limiter's, exactly.
func TestTransportZero429s(t *testing.T) {
	virtual(t, func(ctx context.Context, vc *vclock.Clock) {
		up := newUpstream(t, vc)
		c := &http.Client{Transport: httplimit.Transport(inMemory{up}, limiter(t, ctx, 5, 5))}
		spawn(t, ctx, c, 50)()
		up.assertPaced(t, 50)
	})
}

// TestTransportControl: the same 50 requests through a limiter far above the
// server's limit do meet 429s, so the zero above is the limiter's doing.
func TestTransportControl(t *testing.T) {
	virtual(t, func(ctx context.Context, vc *vclock.Clock) {
		up := newUpstream(t, vc)
		c := &http.Client{Transport: httplimit.Transport(inMemory{up}, limiter(t, ctx, 1000, 50))}
		var fs []*sched.Fiber
		for range 50 {
			fs = append(fs, sched.Go(ctx, func(ctx context.Context) error { _, err := status(t, c, ctx, http.MethodGet); return err }))
		}
		for _, f := range fs {
			require.NoError(t, f.Wait(ctx))
		}
		_, codes := up.log()
		assert.Contains(t, codes, 429)
	})
}

// TestTransportHoldsAfter429: after a forced 429 with Retry-After: 2, no
// request reaches the server for exactly 2 s; then the queue goes on in
// order at the limiter's pace.
func TestTransportHoldsAfter429(t *testing.T) {
	for name, hdr := range map[string]http.Header{
		"seconds":   {"Retry-After": {"2"}},
		"http-date": {"Retry-After": {"Sat, 01 Jan 2000 00:00:02 GMT"}, "Date": {"Sat, 01 Jan 2000 00:00:00 GMT"}},
		"RateLimit": {"Ratelimit": {`"api";r=0;t=2`}},
		// Retry-After takes precedence over RateLimit (the draft's §7).
		"both": {"Retry-After": {"2"}, "Ratelimit": {`"api";r=0;t=9`}},
		"503":  {"Retry-After": {"2"}, "X-Status": {"503"}},
	} {
		t.Run(name, func(t *testing.T) {
			virtual(t, func(ctx context.Context, vc *vclock.Clock) {
				up := newUpstream(t, vc)
				up.header = hdr
				up.force.Store(1)
				rt := httplimit.Transport(inMemory{up}, limiter(t, ctx, 5, 5))
				c := &http.Client{Transport: rt}

				code, err := status(t, c, ctx, http.MethodGet)
				require.NoError(t, err)
				require.Contains(t, []int{429, 503}, code, "the refusal is returned to the caller, not retried")
				assert.Equal(t, vc.Now().Add(2*time.Second), rt.Hold())

				spawn(t, ctx, c, 8)()
				up.assertHeld(t, code)
			})
		})
	}
}

// TestTransportCancelLeavesQueue: a request cancelled while it waits sends
// nothing, leaves the queue, and holds nothing: the one behind it goes at
// the instant it would have had the cancelled one never come.
func TestTransportCancelLeavesQueue(t *testing.T) {
	virtual(t, func(ctx context.Context, vc *vclock.Clock) {
		up := newUpstream(t, vc)
		c := &http.Client{Transport: httplimit.Transport(inMemory{up}, limiter(t, ctx, 1, 1))}

		code, err := status(t, c, ctx, http.MethodGet) // takes the only token
		require.NoError(t, err)
		require.Equal(t, 200, code)

		bctx, cancel := context.WithCancel(ctx)
		var cancelled error
		b := sched.Go(ctx, func(context.Context) error { _, cancelled = status(t, c, bctx, http.MethodGet); return nil })
		sched.Yield(ctx) // B waits for the token due at 1 s
		var third time.Duration
		cf := sched.Go(ctx, func(ctx context.Context) error {
			_, err := status(t, c, ctx, http.MethodGet)
			assert.NoError(t, err)
			third = up.since()
			return nil
		})
		sched.Yield(ctx) // C waits behind B
		require.NoError(t, sched.Sleep(ctx, 500*time.Millisecond))
		cancel()
		_ = b.Wait(ctx)
		_ = cf.Wait(ctx)
		assert.ErrorIs(t, cancelled, context.Canceled)
		arrivals, _ := up.log()
		assert.Len(t, arrivals, 2, "the cancelled request sent nothing")
		assert.Equal(t, time.Second, third, "C got the token B was waiting for, at 1 s")
	})
}

// TestTransportCancelDuringHold: a request waiting out a hold leaves when its
// ctx ends, and one whose deadline falls inside the hold fails at once.
func TestTransportCancelDuringHold(t *testing.T) {
	virtual(t, func(ctx context.Context, vc *vclock.Clock) {
		up := newUpstream(t, vc)
		up.force.Store(1)
		c := &http.Client{Transport: httplimit.Transport(inMemory{up}, limiter(t, ctx, 5, 5))}
		_, err := status(t, c, ctx, http.MethodGet)
		require.NoError(t, err)

		start := vc.Now()
		dctx, cancel := sched.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err = status(t, c, dctx, http.MethodGet)
		assert.ErrorIs(t, err, httplimit.ErrHeldPastDeadline)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, start, vc.Now(), "failed at once, no wait for a certain timeout")

		cctx, cancel2 := context.WithCancel(ctx)
		sched.Go(ctx, func(ctx context.Context) error {
			_ = sched.Sleep(ctx, 300*time.Millisecond)
			cancel2()
			return nil
		})
		_, err = status(t, c, cctx, http.MethodGet)
		assert.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, 300*time.Millisecond, vc.Since(start))
		arrivals, _ := up.log()
		assert.Len(t, arrivals, 1)
	})
}

// TestTransportRetry: retries are opt-in, idempotent methods only, bounded,
// and each waits out the hold.
func TestTransportRetry(t *testing.T) {
	virtual(t, func(ctx context.Context, vc *vclock.Clock) {
		up := newUpstream(t, vc)
		up.force.Store(1)
		c := &http.Client{Transport: httplimit.Transport(inMemory{up}, limiter(t, ctx, 5, 5), httplimit.Retry(3))}
		code, err := status(t, c, ctx, http.MethodGet)
		require.NoError(t, err)
		assert.Equal(t, 200, code, "retried after the hold")
		arrivals, codes := up.log()
		assert.Equal(t, []int{429, 200}, codes)
		assert.Equal(t, []time.Duration{0, 2 * time.Second}, arrivals)

		up.force.Store(1)
		code, err = status(t, c, ctx, http.MethodPost)
		require.NoError(t, err)
		assert.Equal(t, 429, code, "POST is not idempotent: never retried")

		up.force.Store(100)
		before := vc.Now()
		code, err = status(t, c, ctx, http.MethodGet)
		require.NoError(t, err)
		assert.Equal(t, 429, code, "three retries, then the last answer")
		_, codes = up.log()
		assert.Len(t, codes, 2+1+4)
		assert.Equal(t, 8*time.Second, vc.Since(before), "the POST's hold, then three more holds of 2 s")
		up.force.Store(0)

		// A body that can be replayed is replayed whole.
		require.NoError(t, sched.Sleep(ctx, 2*time.Second))
		up.force.Store(1)
		var bodies []string
		c2 := &http.Client{Transport: httplimit.Transport(inMemory{http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			bodies = append(bodies, string(b))
			up.ServeHTTP(w, r)
		})}, limiter(t, ctx, 5, 5), httplimit.Retry(1))}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, "http://api.test/x", strings.NewReader("payload"))
		resp, err := c2.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, 200, resp.StatusCode)
		assert.Equal(t, []string{"payload", "payload"}, bodies)
	})
}

// adaptive is a Limiter with SetRate and SetBurst that records them.
type adaptive struct {
	rate  float64
	burst int
}

func (a *adaptive) Acquire(ctx context.Context, n int) error { return ctx.Err() }
func (a *adaptive) Rate() float64                            { return a.rate }
func (a *adaptive) SetRate(r float64) error                  { a.rate = r; return nil }
func (a *adaptive) Burst() int                               { return a.burst }
func (a *adaptive) SetBurst(b int) error                     { a.burst = b; return nil }

// adaptable is what TestTransportAdaptsToPolicy reads back.
type adaptable interface {
	httplimit.Limiter
	Rate() float64
	Burst() int
}

// TestTransportAdaptsToPolicy: with AdaptToPolicy the limiter's rate and
// burst come down to the upstream's advertised policy, never up, on a
// stand-in limiter and on the real *ratelimiter.Limiter (whose pace then
// follows: the real one runs in a synctest bubble, so its waits are exact).
func TestTransportAdaptsToPolicy(t *testing.T) {
	steps := []struct {
		policy string
		rate   float64
		burst  int
	}{
		{`"a";q=100;w=1`, 10, 10},                          // higher: never raised
		{`"a";q=3;w=2;sluice-burst=4`, 1.5, 4},             // lowered to 1.5/s, burst 4
		{`"a";q=oops;w=1, "b";q=1;w=1`, 1, 4},              // a malformed member is ignored
		{`"day";q=86400;w=86400, "min";q=30;w=60`, 0.5, 4}, // the strictest policy wins
		{`garbage,,;`, 0.5, 4},                             // nothing usable: unchanged
	}
	var (
		mu       sync.Mutex
		policy   string
		arrivals []time.Time
	)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		arrivals = append(arrivals, time.Now())
		if policy != "" {
			w.Header().Set("RateLimit-Policy", policy)
		}
	})
	run := func(t *testing.T, lim adaptable) {
		c := &http.Client{Transport: httplimit.Transport(inMemory{h}, lim, httplimit.AdaptToPolicy())}
		for _, step := range steps {
			mu.Lock()
			policy = step.policy
			mu.Unlock()
			code, err := status(t, c, context.Background(), http.MethodGet)
			require.NoError(t, err)
			require.Equal(t, 200, code)
			assert.Equal(t, step.rate, lim.Rate(), step.policy)
			assert.Equal(t, step.burst, lim.Burst(), step.policy)
		}
	}
	t.Run("stand-in", func(t *testing.T) { run(t, &adaptive{rate: 10, burst: 10}) })
	t.Run("ratelimiter", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			lim, err := ratelimiter.New(context.Background(), 10, 10)
			require.NoError(t, err)
			defer lim.Stop()
			mu.Lock()
			arrivals = nil
			mu.Unlock()
			start := time.Now()
			run(t, lim)
			// The bucket held 8 when burst 4 cut it to 4; three more
			// requests took 3. Now the limiter's pace is the upstream's
			// 0.5/s: one at once, then one every 2 s.
			mu.Lock()
			policy = ""
			mu.Unlock()
			c := &http.Client{Transport: httplimit.Transport(inMemory{h}, lim)}
			for range 3 {
				_, err := status(t, c, context.Background(), http.MethodGet)
				require.NoError(t, err)
			}
			mu.Lock()
			defer mu.Unlock()
			var got []time.Duration
			for _, at := range arrivals {
				got = append(got, at.Sub(start))
			}
			assert.Equal(t, []time.Duration{0, 0, 0, 0, 0, 0, 2 * time.Second, 4 * time.Second}, got)
		})
	})

	// Without the option the limiter is left alone.
	lim := &adaptive{rate: 10, burst: 10}
	policy = `"a";q=1;w=1`
	c := &http.Client{Transport: httplimit.Transport(inMemory{h}, lim)}
	_, err := status(t, c, context.Background(), http.MethodGet)
	require.NoError(t, err)
	assert.Equal(t, 10.0, lim.rate)
}

// TestTransportClosesBodyOnCancel: a request that never leaves still has its
// body closed, as the RoundTripper contract asks.
func TestTransportClosesBodyOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	body := &closeSpy{Reader: strings.NewReader("x")}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://api.test/x", body)
	_, err := httplimit.Transport(inMemory{http.NotFoundHandler()}, &adaptive{}).RoundTrip(req)
	assert.True(t, errors.Is(err, context.Canceled))
	assert.True(t, body.closed)
}

type closeSpy struct {
	io.Reader
	closed bool
}

func (c *closeSpy) Close() error { c.closed = true; return nil }

// TestTransportLoopbackHold runs the hold end to end over real loopback HTTP
// and real time: after a 429 with Retry-After: 1, the next request reaches
// the server no sooner than a second later. (The second of real time is the
// behaviour under test, not a wait for state.)
func TestTransportLoopbackHold(t *testing.T) {
	var mu sync.Mutex
	var arrivals []time.Time
	srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrivals = append(arrivals, time.Now())
		first := len(arrivals) == 1
		mu.Unlock()
		if first {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	lim, err := ratelimiter.New(context.Background(), 100, 5)
	require.NoError(t, err)
	defer lim.Stop()
	base := http.DefaultTransport.(*http.Transport).Clone()
	defer base.CloseIdleConnections()
	c := &http.Client{Transport: httplimit.Transport(base, lim)}
	for _, want := range []int{429, 200} {
		resp, err := c.Get(srv.URL)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, want, resp.StatusCode)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, arrivals, 2)
	assert.GreaterOrEqual(t, arrivals[1].Sub(arrivals[0]), time.Second)
}

// TestTransportHoldCaps: every answer that means "later" holds the queue,
// for at most MaxHold, however large the figure (none overflows into "no
// hold"); an answer that means "now" or nothing holds nothing.
func TestTransportHoldCaps(t *testing.T) {
	const never = -1
	for _, c := range []struct {
		name string
		hdr  http.Header
		want time.Duration // the hold from now; never for none
	}{
		{"seconds", http.Header{"Retry-After": {"7"}}, 7 * time.Second},
		{"leading zeros", http.Header{"Retry-After": {"000000000000000000000000000007"}}, 7 * time.Second},
		{"an hour and a second", http.Header{"Retry-After": {"3601"}}, httplimit.MaxHold},
		{"int64 max", http.Header{"Retry-After": {"9223372036854775807"}}, httplimit.MaxHold},
		{"uint64 max + 1", http.Header{"Retry-After": {"18446744073709551616"}}, httplimit.MaxHold},
		{"20 digits", http.Header{"Retry-After": {"100000000000000000000"}}, httplimit.MaxHold},
		{"400 digits", http.Header{"Retry-After": {strings.Repeat("9", 400)}}, httplimit.MaxHold},
		{"date in year 9999", http.Header{"Retry-After": {"Fri, 31 Dec 9999 23:59:59 GMT"}, "Date": {"Sat, 01 Jan 2000 00:00:00 GMT"}}, httplimit.MaxHold},
		{"date from year 1", http.Header{"Retry-After": {"Sat, 01 Jan 2000 00:00:02 GMT"}, "Date": {"Mon, 01 Jan 0001 00:00:00 GMT"}}, httplimit.MaxHold},
		{"date in the past", http.Header{"Retry-After": {"Sat, 01 Jan 2000 00:00:00 GMT"}, "Date": {"Sat, 01 Jan 2000 00:00:09 GMT"}}, 0},
		{"RateLimit t huge", http.Header{"Ratelimit": {`"api";r=0;t=100000000000000000000`}}, httplimit.MaxHold},
		{"RateLimit t int64 max", http.Header{"Ratelimit": {`"api";r=0;t=9223372036854775807`}}, httplimit.MaxHold},
		{"RateLimit t huge, r huge", http.Header{"Ratelimit": {`"api";r=100000000000000000000;t=100000000000000000000`}}, never},
		{"negative", http.Header{"Retry-After": {"-5"}}, never},
		{"not a number", http.Header{"Retry-After": {"soon"}}, never},
	} {
		t.Run(c.name, func(t *testing.T) {
			virtual(t, func(ctx context.Context, vc *vclock.Clock) {
				up := newUpstream(t, vc)
				up.header = c.hdr
				up.force.Store(1)
				rt := httplimit.Transport(inMemory{up}, limiter(t, ctx, 5, 5))
				code, err := status(t, &http.Client{Transport: rt}, ctx, http.MethodGet)
				require.NoError(t, err)
				require.Equal(t, 429, code)
				if c.want == never {
					assert.True(t, rt.Hold().IsZero(), "hold until %v", rt.Hold())
					return
				}
				assert.Equal(t, vc.Now().Add(c.want), rt.Hold())
			})
		})
	}
}
