package clientcheck_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/client"
	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/sched"
	"github.com/sluice-go/sluice/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// inProcess is an http.RoundTripper that serves requests with a handler in
// the same process (inside a synctest bubble time is virtual for both ends).
// It honours the request's context like a real transport.
type inProcess struct {
	h     http.Handler
	calls atomic.Int64
}

func (p *inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	p.calls.Add(1)
	done := make(chan *http.Response, 1)
	go func() {
		rec := httptest.NewRecorder()
		p.h.ServeHTTP(rec, req)
		done <- rec.Result()
	}()
	select {
	case resp := <-done:
		return resp, nil
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
}

// newService returns the service handler over a memory store (10/s, burst
// 10 by default) and a closer.
func newService(t *testing.T, limits string) http.Handler {
	t.Helper()
	mem := store.NewMemory()
	t.Cleanup(func() { _ = mem.Close() })
	l, err := service.ParseLimits(limits)
	require.NoError(t, err)
	srv, err := service.New(service.Config{Store: mem, Default: store.Policy{Rate: 10, Burst: 10}, Limits: l,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	return srv
}

func newClient(t *testing.T, rt http.RoundTripper, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New("http://sluice.test", append([]client.Option{client.WithHTTPClient(&http.Client{Transport: rt})}, opts...)...)
	require.NoError(t, err)
	return c
}

func TestAllowAndDenyCache(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &inProcess{h: newService(t, "k=10:2")}
		c := newClient(t, rt)
		ctx := context.Background()
		for i := range 2 {
			d, err := c.Allow(ctx, "k", 1)
			require.NoError(t, err)
			require.True(t, d.Allowed, "request %d", i)
			assert.Equal(t, client.FromServer, d.Source)
			assert.EqualValues(t, 2, d.Limit)
			assert.EqualValues(t, 10, d.Rate)
		}
		d, err := c.Allow(ctx, "k", 1)
		require.NoError(t, err)
		require.False(t, d.Allowed)
		assert.Equal(t, 100*time.Millisecond, d.RetryAfter)
		require.EqualValues(t, 3, rt.calls.Load())

		time.Sleep(40 * time.Millisecond)
		d, err = c.Allow(ctx, "k", 1)
		require.NoError(t, err)
		assert.False(t, d.Allowed)
		assert.Equal(t, client.FromCache, d.Source)
		assert.Equal(t, 60*time.Millisecond, d.RetryAfter)
		d, _ = c.Allow(ctx, "k", 2)
		assert.Equal(t, client.FromCache, d.Source, "a larger request is denied too")
		assert.EqualValues(t, 3, rt.calls.Load(), "cached denials cost no request")
		d, _ = c.Allow(ctx, "other", 1)
		assert.True(t, d.Allowed, "the cache is per key")

		time.Sleep(60 * time.Millisecond)
		d, err = c.Allow(ctx, "k", 1)
		require.NoError(t, err)
		assert.True(t, d.Allowed, "after the retry-after the service is asked again")
		assert.Equal(t, client.FromServer, d.Source)
	})
}

func TestAcquireWaitsRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient(t, &inProcess{h: newService(t, "k=10:2")}, client.WithJitter(0.1))
		ctx := context.Background()
		start := time.Now()
		for range 2 {
			require.NoError(t, c.Acquire(ctx, "k", 1))
		}
		assert.Zero(t, time.Since(start), "the burst is there at once")
		require.NoError(t, c.Acquire(ctx, "k", 1))
		waited := time.Since(start)
		assert.GreaterOrEqual(t, waited, 100*time.Millisecond, "never earlier than the retry-after")
		assert.LessOrEqual(t, waited, 110*time.Millisecond, "at most 10%% jitter")
		require.NoError(t, c.Acquire(ctx, "k", 2), "n=2 waits for two tokens")
		assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	})
}

// capped is a RoundTripper that cancels a test's context once it has
// carried max requests, so that a client asking in a loop ends the test
// instead of hanging it.
type capped struct {
	rt     *inProcess
	max    int64
	cancel context.CancelFunc
}

func (c *capped) RoundTrip(req *http.Request) (*http.Response, error) {
	if c.rt.calls.Load() >= c.max {
		c.cancel()
	}
	return c.rt.RoundTrip(req)
}

// A jitter too large for the wait to stay a Duration (here +Inf) still
// never shortens the wait: the extra is capped at MaxRetryWait. Before, it
// wrapped to a negative wait and Acquire asked again without sleeping.
func TestAcquireHugeJitter(t *testing.T) {
	for _, j := range []float64{math.Inf(1), 1e12} {
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			rt := &inProcess{h: newService(t, "k=10:1")}
			c := newClient(t, &capped{rt: rt, max: 100, cancel: cancel}, client.WithJitter(j), client.WithoutDenyCache())
			require.NoError(t, c.Acquire(ctx, "k", 1))
			start := time.Now()
			require.NoError(t, c.Acquire(ctx, "k", 1), "jitter %v", j)
			waited := time.Since(start)
			assert.GreaterOrEqual(t, waited, 100*time.Millisecond, "jitter %v: never earlier than the retry-after", j)
			assert.LessOrEqual(t, waited, 100*time.Millisecond+client.MaxRetryWait, "jitter %v: the extra is at most MaxRetryWait", j)
			assert.LessOrEqual(t, rt.calls.Load(), int64(3), "jitter %v: one wait, not a loop of asks", j)
		})
	}
}

func TestAcquireGivesUpAtOnceBeforeDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient(t, &inProcess{h: newService(t, "slow=1:1")})
		require.NoError(t, c.Acquire(context.Background(), "slow", 1))
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := c.Acquire(ctx, "slow", 1)
		require.ErrorIs(t, err, client.ErrWaitPastDeadline)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Zero(t, time.Since(start), "no sleep toward a certain failure")

		// Cancelled mid-wait: returns ctx.Err() when cancelled.
		ctx2, cancel2 := context.WithCancel(context.Background())
		go func() { time.Sleep(300 * time.Millisecond); cancel2() }()
		start = time.Now()
		err = c.Acquire(ctx2, "slow", 1)
		require.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, 300*time.Millisecond, time.Since(start))
	})
}

func TestRequestErrorIsNotFailMode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient(t, &inProcess{h: newService(t, "")})
		_, err := c.Allow(context.Background(), "k", 11)
		var re *client.RequestError
		require.ErrorAs(t, err, &re)
		assert.Equal(t, 400, re.Status)
		assert.Contains(t, re.Message, "can never be allowed")
		require.ErrorAs(t, c.Acquire(context.Background(), "k", 11), &re)
	})
}

type failing struct{}

func (failing) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, errors.New("dial tcp: connection refused")
}

func TestFailModes(t *testing.T) {
	ctx := context.Background()
	open := newClient(t, failing{}, client.WithFailMode(store.FailOpen))
	d, err := open.Allow(ctx, "k", 1)
	require.ErrorIs(t, err, client.ErrUnavailable)
	assert.True(t, d.Allowed)
	assert.Equal(t, client.FromFailMode, d.Source)
	require.NoError(t, open.Acquire(ctx, "k", 1))

	closed := newClient(t, failing{}, client.WithFailMode(store.FailClosed))
	d, err = closed.Allow(ctx, "k", 1)
	require.ErrorIs(t, err, client.ErrUnavailable)
	assert.False(t, d.Allowed)
	require.ErrorIs(t, closed.Acquire(ctx, "k", 1), client.ErrUnavailable)

	// A 5xx is unavailability too.
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "boom", http.StatusBadGateway) })
	c5 := newClient(t, &inProcess{h: h}, client.WithFailMode(store.FailClosed))
	d, err = c5.Allow(ctx, "k", 1)
	require.ErrorIs(t, err, client.ErrUnavailable)
	assert.ErrorContains(t, err, "status 502")
	assert.False(t, d.Allowed)
}

func TestPerCallTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		stuck := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
		c := newClient(t, &inProcess{h: stuck}, client.WithTimeout(200*time.Millisecond), client.WithFailMode(store.FailOpen))
		start := time.Now()
		d, err := c.Allow(context.Background(), "k", 1)
		require.ErrorIs(t, err, client.ErrUnavailable)
		assert.True(t, d.Allowed, "fail open")
		assert.Equal(t, 200*time.Millisecond, time.Since(start))
	})
}

// Three replicas each wanting 20/s of a 10/s key (burst 10) for 4 s of
// virtual time: the sum is held at rate·T + burst.
func TestThreeReplicasShareOneLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &inProcess{h: newService(t, "tenant-a=10:10")}
		start := time.Now()
		var total atomic.Int64
		var per [3]int64
		var wg sync.WaitGroup
		for i := range 3 {
			c := newClient(t, rt)
			wg.Go(func() {
				tick := time.NewTicker(50 * time.Millisecond)
				defer tick.Stop()
				for time.Since(start) < 4*time.Second {
					d, err := c.Allow(context.Background(), "tenant-a", 1)
					if assert.NoError(t, err) && d.Allowed {
						per[i]++
						total.Add(1)
					}
					<-tick.C
				}
			})
		}
		wg.Wait()
		elapsed := time.Since(start)
		bound := int64(10*elapsed.Seconds()) + 10
		assert.LessOrEqual(t, total.Load(), bound)
		assert.GreaterOrEqual(t, total.Load(), bound-2, "demand is 6× the limit: the limit is used")
		for i, n := range per {
			assert.Greater(t, n, int64(5), "replica %d got a share", i)
		}
	})
}

func TestNewRejectsBadURL(t *testing.T) {
	for _, u := range []string{"", "127.0.0.1:8100", "ftp://x", "http://"} {
		_, err := client.New(u)
		assert.Error(t, err, u)
	}
}

// Real loopback HTTP: the default transport against a real listener.
func TestLoopback(t *testing.T) {
	ts := httptest.NewServer(newService(t, "k=1:3"))
	defer ts.Close()
	c, err := client.New(ts.URL)
	require.NoError(t, err)
	defer c.Close()
	start := time.Now()
	for range 3 {
		d, err := c.Allow(context.Background(), "k", 1)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	d, err := c.Allow(context.Background(), "k", 1)
	elapsed := time.Since(start)
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	// The first token comes back 1 s after it was spent, so the wait is 1 s
	// less the time the four calls took (never more than elapsed here), to
	// the millisecond the body carries. Why not a fixed tolerance: on a
	// loaded machine four loopback calls can take longer than any fixed one.
	assert.LessOrEqual(t, d.RetryAfter, time.Second)
	assert.GreaterOrEqual(t, d.RetryAfter, time.Second-elapsed-time.Millisecond)
}

// replying answers every request with one status and body, counting calls.
func replying(status int, body string) *inProcess {
	return &inProcess{h: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	})}
}

// A reply the client cannot use is the service being unavailable: Allow
// returns the fail mode's decision with ErrUnavailable, and Acquire asks
// once instead of spinning.
func TestUnusableRepliesAreUnavailable(t *testing.T) {
	for _, c := range []struct {
		name, body string
		status     int
	}{
		{"retry after 0", `{"allowed":false,"remaining":0,"limit":1,"rate":1,"retry_after_ms":0}`, 429},
		{"negative retry after", `{"allowed":false,"retry_after_ms":-5}`, 429},
		{"retry after overflows a Duration", `{"allowed":false,"retry_after_ms":9223372036854775807}`, 429},
		{"no retry after", `{"allowed":false}`, 429},
		{"empty object", `{}`, 200},
		{"200 that denies", `{"allowed":false,"retry_after_ms":100}`, 200},
		{"429 that allows", `{"allowed":true}`, 429},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				for _, mode := range []store.FailMode{store.FailOpen, store.FailClosed} {
					rt := replying(c.status, c.body)
					cl := newClient(t, rt, client.WithFailMode(mode))
					d, err := cl.Allow(context.Background(), "k", 1)
					require.ErrorIs(t, err, client.ErrUnavailable)
					assert.Equal(t, client.FromFailMode, d.Source)
					assert.Equal(t, mode == store.FailOpen, d.Allowed)

					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					err = cl.Acquire(ctx, "k", 1)
					cancel()
					if mode == store.FailOpen {
						require.NoError(t, err)
					} else {
						require.ErrorIs(t, err, client.ErrUnavailable)
					}
					assert.EqualValues(t, 2, rt.calls.Load(), "%v: one request per call, no spinning", mode)
				}
			})
		})
	}
}

// Every wait is clamped: a tiny retry-after is waited at least
// MinRetryWait, a long one is slept in MaxRetryWait slices.
func TestAcquireClampsWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := replying(429, `{"allowed":false,"retry_after_ms":0.001}`)
		c := newClient(t, rt)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		require.ErrorIs(t, c.Acquire(ctx, "k", 1), context.DeadlineExceeded)
		assert.LessOrEqual(t, rt.calls.Load(), int64(time.Second/client.MinRetryWait)+1)
		assert.Greater(t, rt.calls.Load(), int64(100), "the floor, not more")

		tenDays := replying(429, `{"allowed":false,"retry_after_ms":864000000}`)
		c = newClient(t, tenDays, client.WithoutDenyCache()) // the cache would answer the re-asks
		ctx, cancel = context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- c.Acquire(ctx, "k", 1) }()
		time.Sleep(5*time.Minute + time.Second)
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		assert.InDelta(t, 5, tenDays.calls.Load(), 1, "asked about once a minute")

		short, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		start := time.Now()
		require.ErrorIs(t, c.Acquire(short, "k", 1), client.ErrWaitPastDeadline, "ten days do not fit in an hour")
		assert.Zero(t, time.Since(start))
	})
}

// n above the burst is a *RequestError even while the key is cached as
// denied.
func TestBadInputIsReportedWhateverTheCacheHolds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newClient(t, &inProcess{h: newService(t, "k=10:2")})
		ctx := context.Background()
		for range 3 {
			_, _ = c.Allow(ctx, "k", 1)
		}
		d, err := c.Allow(ctx, "k", 2)
		require.NoError(t, err)
		require.Equal(t, client.FromCache, d.Source, "the key is cached as denied")
		var re *client.RequestError
		_, err = c.Allow(ctx, "k", 3)
		require.ErrorAs(t, err, &re, "3 is above the burst of 2")
		assert.Contains(t, re.Message, "can never be allowed")
		_, err = c.Allow(ctx, "k", 0)
		require.ErrorAs(t, err, &re)
	})
}

// TestAcquireWaitsOnTheLoopsClock: inside a sched.Run loop on a virtual
// clock, Acquire waits out the service's retry-after on the loop's clock: the
// virtual second passes at once, and the cached denial ends with it.
func TestAcquireWaitsOnTheLoopsClock(t *testing.T) {
	var calls atomic.Int64
	rt := &inProcess{h: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, `{"allowed":false,"remaining":0,"limit":1,"rate":1,"retry_after_ms":1000}`)
			return
		}
		_, _ = io.WriteString(w, `{"allowed":true,"remaining":0,"limit":1,"rate":1}`)
	})}
	c := newClient(t, rt, client.WithJitter(0))
	wall := time.Now()
	err := sched.Run(context.Background(), func(ctx context.Context) error {
		start := sched.Now(ctx)
		require.NoError(t, c.Acquire(ctx, "k", 1))
		assert.Equal(t, time.Second, sched.Now(ctx).Sub(start), "the retry-after, on the virtual clock")
		return nil
	}, sched.Virtual(time.Time{}))
	require.NoError(t, err)
	assert.Equal(t, int64(2), calls.Load())
	assert.Less(t, time.Since(wall), 500*time.Millisecond, "no real second waited")
}

// TestDenyCacheKeepsClocksApart: a denial cached at an instant of one clock
// never answers a caller on another. A denial cached inside a virtual-time
// loop (its clock in the year 2000) must not answer a real-time caller with
// a retry-after of decades (a virtual clock may start in any year), and
// one cached in real time must not make a
// virtual-time caller's Acquire fail at once for a wait of decades: each
// asks the service.
func TestDenyCacheKeepsClocksApart(t *testing.T) {
	var calls atomic.Int64
	rt := &inProcess{h: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		calls.Add(1)
		if r.URL.Query().Get("key") == "denied" {
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, `{"allowed":false,"remaining":0,"limit":1,"rate":1,"retry_after_ms":1000}`)
			return
		}
		_, _ = io.WriteString(w, `{"allowed":true,"remaining":0,"limit":1,"rate":1}`)
	})}
	t.Run("virtual then real", func(t *testing.T) {
		c := newClient(t, rt, client.WithJitter(0))
		require.NoError(t, sched.Run(context.Background(), func(ctx context.Context) error {
			d, err := c.Allow(ctx, "denied", 1)
			require.NoError(t, err)
			assert.False(t, d.Allowed)
			return nil
		}, sched.Virtual(time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC))))
		before := calls.Load()
		d, err := c.Allow(context.Background(), "denied", 1)
		require.NoError(t, err)
		assert.False(t, d.Allowed)
		assert.Equal(t, client.FromServer, d.Source, "asked the service, not a virtual-time entry")
		assert.LessOrEqual(t, d.RetryAfter, time.Second)
		assert.Equal(t, before+1, calls.Load())
	})
	t.Run("real then virtual", func(t *testing.T) {
		c := newClient(t, rt, client.WithJitter(0))
		d, err := c.Allow(context.Background(), "denied", 1)
		require.NoError(t, err)
		require.False(t, d.Allowed)
		require.NoError(t, sched.Run(context.Background(), func(ctx context.Context) error {
			before := calls.Load()
			d, err := c.Allow(ctx, "denied", 1)
			require.NoError(t, err)
			assert.Equal(t, client.FromServer, d.Source, "asked the service, not a real-time entry")
			assert.LessOrEqual(t, d.RetryAfter, time.Second)
			assert.Equal(t, before+1, calls.Load())
			// Acquire waits the virtual retry-after and asks again: with a
			// deadline an hour ahead it must not give up at once.
			ctx, cancel := sched.WithTimeout(ctx, time.Hour)
			defer cancel()
			start := sched.Now(ctx)
			err = c.Acquire(ctx, "denied", 1)
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			assert.GreaterOrEqual(t, sched.Now(ctx).Sub(start), 59*time.Minute, "waited on the loop's clock, not failed at once")
			return nil
		}, sched.Virtual(time.Time{})))
	})
	t.Run("two loops", func(t *testing.T) {
		// Two virtual runs on clocks a year apart: the later one's entry
		// does not answer the earlier one.
		c := newClient(t, rt, client.WithJitter(0))
		run := func(start time.Time) client.Decision {
			var d client.Decision
			require.NoError(t, sched.Run(context.Background(), func(ctx context.Context) error {
				var err error
				d, err = c.Allow(ctx, "denied", 1)
				require.NoError(t, err)
				return nil
			}, sched.Virtual(start)))
			return d
		}
		run(time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC))
		d := run(time.Time{})
		assert.Equal(t, client.FromServer, d.Source)
		assert.LessOrEqual(t, d.RetryAfter, time.Second)
	})
}
