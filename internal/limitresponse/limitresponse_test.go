package limitresponse

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestPolicyField pins RateLimit-Policy for every shape of policy: q/w is
// the rate, whatever the burst.
func TestPolicyField(t *testing.T) {
	cases := []struct {
		name  string
		rate  float64
		burst int64
		want  string
	}{
		{"rate<burst", 10, 20, `"p";q=10;w=1;sluice-burst=20`},
		{"rate=burst", 10, 10, `"p";q=10;w=1;sluice-burst=10`},
		{"rate>burst", 100, 1, `"p";q=100;w=1;sluice-burst=1`}, // was q=1;w=1: 1/s
		{"rate>burst big", 1000, 5, `"p";q=1000;w=1;sluice-burst=5`},
		{"fractional rate", 2.5, 10, `"p";q=5;w=2;sluice-burst=10`},
		{"under 1/s", 0.4, 2, `"p";q=2;w=5;sluice-burst=2`},
		{"a third", 1.0 / 3, 1, `"p";q=1;w=3;sluice-burst=1`},
		{"one an hour", 1.0 / 3600, 5, `"p";q=1;w=3600;sluice-burst=5`},
		{"one every two days", 1.0 / 172800, 1, `"p";q=1;w=172800;sluice-burst=1`},
		{"no exact quota in a day", 0.1234567891234, 3, `"p";q=10666;w=86400;sluice-burst=3`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := store.Policy{Name: "p", Rate: c.rate, Burst: c.burst}
			require.NoError(t, p.Validate())
			assert.Equal(t, c.want, PolicyField(p))
		})
	}
}

func TestPolicyFieldQuotesName(t *testing.T) {
	assert.Equal(t, `"a\"b\\c";q=1;w=1;sluice-burst=1`, PolicyField(store.Policy{Name: `a"b\c`, Rate: 1, Burst: 1}))
}

// decide runs one Memory-store decision at a hand-driven time.
type bucket struct {
	now time.Duration
	mem *store.Memory
	p   store.Policy
}

func newBucket(t *testing.T, rate float64, burst int64) *bucket {
	b := &bucket{now: time.Hour, p: store.Policy{Name: "p", Rate: rate, Burst: burst}}
	b.mem = store.NewMemory(store.WithClock(func() time.Duration { return b.now }))
	t.Cleanup(func() { _ = b.mem.Close() })
	return b
}

func (b *bucket) allow(t *testing.T, n int64) store.Result {
	r, err := b.mem.Allow(t.Context(), "k", n, b.p)
	require.NoError(t, err)
	return r
}

// TestRateLimitField checks r and t, and Retry-After, against the bucket's
// real state for rate < burst, = and >.
func TestRateLimitField(t *testing.T) {
	type step struct {
		advance    time.Duration
		n          int64
		status     int
		rateLimit  string
		retryAfter string
		remaining  string
	}
	cases := []struct {
		name        string
		rate        float64
		burst       int64
		policyField string
		steps       []step
	}{
		{"rate<burst", 2, 4, `"p";q=2;w=1;sluice-burst=4`, []step{
			{0, 1, 200, `"p";r=3;t=1`, "", "3"},
			{0, 3, 200, `"p";r=0;t=1`, "", "0"},
			{0, 1, 429, `"p";r=0;t=1`, "1", "0"},
			{500 * time.Millisecond, 1, 200, `"p";r=0;t=1`, "", "0"},
		}},
		{"rate=burst", 10, 10, `"p";q=10;w=1;sluice-burst=10`, []step{
			{0, 10, 200, `"p";r=0;t=1`, "", "0"},
			{0, 1, 429, `"p";r=0;t=1`, "1", "0"},
			{time.Second, 1, 200, `"p";r=9;t=1`, "", "9"},
		}},
		{"rate>burst", 100, 1, `"p";q=100;w=1;sluice-burst=1`, []step{
			{0, 1, 200, `"p";r=0;t=1`, "", "0"},
			{0, 1, 429, `"p";r=0;t=1`, "1", "0"},
			{10 * time.Millisecond, 1, 200, `"p";r=0;t=1`, "", "0"},
		}},
		// Slow: T = 2.5 s; t is the wait for the next whole token, rounded up.
		{"slow", 0.4, 2, `"p";q=2;w=5;sluice-burst=2`, []step{
			{0, 1, 200, `"p";r=1;t=3`, "", "1"},
			{0, 1, 200, `"p";r=0;t=3`, "", "0"},
			{time.Millisecond, 1, 429, `"p";r=0;t=3`, "3", "0"},
			{time.Second, 1, 429, `"p";r=0;t=2`, "2", "0"},
			// 1.499 s later the first token is back and the second 2.5 s away.
			{1499 * time.Millisecond, 1, 200, `"p";r=0;t=3`, "", "0"},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := newBucket(t, c.rate, c.burst)
			e := NewPolicy(b.p)
			for i, s := range c.steps {
				b.now += s.advance
				res := b.allow(t, s.n)
				w := httptest.NewRecorder()
				e.WriteDecision(w, res, false)
				assert.Equal(t, s.status, w.Code, "step %d", i)
				h := w.Result().Header
				assert.Equal(t, c.policyField, h.Get("RateLimit-Policy"), "step %d", i)
				assert.Equal(t, s.rateLimit, h.Get("RateLimit"), "step %d", i)
				assert.Equal(t, s.retryAfter, h.Get("Retry-After"), "step %d", i)
				assert.Equal(t, s.remaining, h.Get("X-RateLimit-Remaining"), "step %d", i)
				assert.Equal(t, []string{"application/json"}, h["Content-Type"])
			}
		})
	}
}

// TestRetryAfterNotBeforeEffectiveWindow checks the draft's §6 rule over a
// sweep of instants: Retry-After ≥ t on every denial, and t never says less
// than the true wait for the next token.
func TestRetryAfterNotBeforeEffectiveWindow(t *testing.T) {
	for _, rate := range []float64{0.3, 0.4, 1, 3, 100} {
		b := newBucket(t, rate, 3)
		e := NewPolicy(b.p)
		for range 3 {
			b.allow(t, 1)
		}
		for step := range 40 {
			b.now += 37 * time.Millisecond
			res := b.allow(t, 1)
			h := http.Header{}
			e.SetHeaders(h, res)
			if res.Allowed {
				continue
			}
			tSec := ceilDiv(e.nextToken(res), time.Second)
			assert.GreaterOrEqual(t, tSec*int64(time.Second), int64(res.RetryAfter), "rate %v step %d", rate, step)
			ra := ceilDiv(res.RetryAfter, time.Second)
			assert.GreaterOrEqual(t, max(1, ra), tSec, "rate %v step %d: Retry-After before the effective window ends", rate, step)
		}
	}
}

func TestShadowDenied(t *testing.T) {
	b := newBucket(t, 1, 1)
	e := NewPolicy(b.p)
	b.allow(t, 1)
	w := httptest.NewRecorder()
	e.WriteDecision(w, b.allow(t, 1), true)
	assert.Equal(t, 200, w.Code)
	assert.Empty(t, w.Result().Header.Get("Retry-After"))
	assert.JSONEq(t, `{"allowed":true,"remaining":0,"limit":1,"rate":1,"retry_after_ms":1000,"shadow_denied":true}`, w.Body.String())
}

func TestDegraded(t *testing.T) {
	e := NewPolicy(store.Policy{Name: "fast", Rate: 100, Burst: 1})
	w := httptest.NewRecorder()
	e.WriteDegraded(w, true)
	assert.Equal(t, 200, w.Code)
	h := w.Result().Header
	assert.Equal(t, `"fast";q=100;w=1;sluice-burst=1`, h.Get("RateLimit-Policy"))
	assert.Equal(t, "1", h.Get("X-RateLimit-Limit"))
	assert.Empty(t, h.Get("RateLimit"))
	assert.Empty(t, h.Get("Retry-After"))
	assert.JSONEq(t, `{"allowed":true,"limit":1,"rate":100,"degraded":"store unavailable; failing open"}`, w.Body.String())

	w = httptest.NewRecorder()
	e.WriteDegraded(w, false)
	assert.Equal(t, 429, w.Code)
	h = w.Result().Header
	assert.Equal(t, `"fast";q=100;w=1;sluice-burst=1`, h.Get("RateLimit-Policy"))
	assert.Equal(t, `"fast";r=0;t=1`, h.Get("RateLimit"))
	assert.Equal(t, "1", h.Get("Retry-After"))
	assert.Equal(t, "0", h.Get("X-RateLimit-Remaining"))
	assert.JSONEq(t, `{"allowed":false,"limit":1,"rate":100,"retry_after_ms":1000,"degraded":"store unavailable; failing closed"}`, w.Body.String())
}

func TestWriteError(t *testing.T) {
	w := httptest.NewRecorder()
	WriteError(w, 400, `bad "key" ☃`)
	assert.Equal(t, 400, w.Code)
	assert.JSONEq(t, `{"error":"bad \"key\" ☃"}`, w.Body.String())
}

func TestSetHeadersAllocs(t *testing.T) {
	e := NewPolicy(store.Policy{Name: "p", Rate: 10, Burst: 20})
	h := http.Header{}
	res := store.Result{Allowed: true, Remaining: 7.5, ResetAfter: 1250 * time.Millisecond}
	allocs := testing.AllocsPerRun(100, func() { e.SetHeaders(h, res) })
	assert.Zero(t, allocs)
	assert.Equal(t, `"p";r=7;t=1`, h.Get("RateLimit"))
}

// TestSetHeadersAllocsUncached: values no cache holds (remaining above 255,
// t above 1, a Retry-After above 1 s) cost two allocations in all, the
// string they are cut from and the []string they share, and come out right.
func TestSetHeadersAllocsUncached(t *testing.T) {
	e := NewPolicy(store.Policy{Name: "p", Rate: 1.0 / 60, Burst: 1000})
	h := http.Header{}
	res := store.Result{Remaining: 999.2, RetryAfter: 90 * time.Second, ResetAfter: 50 * time.Second}
	allocs := testing.AllocsPerRun(100, func() { e.SetHeaders(h, res) })
	assert.Equal(t, 2.0, allocs)
	assert.Equal(t, "999", h.Get("X-RateLimit-Remaining"))
	assert.Equal(t, `"p";r=999;t=50`, h.Get("RateLimit"))
	assert.Equal(t, "90", h.Get("Retry-After"))
	assert.Equal(t, "1000", h.Get("X-RateLimit-Limit"))
	for _, k := range []string{"X-Ratelimit-Remaining", "Ratelimit", "Retry-After"} {
		require.Len(t, h[k], 1)
		assert.Equal(t, 1, cap(h[k]), "%s: capped, so an append cannot reach a neighbour", k)
	}
}

var policySink *Policy

// TestNewPolicyBuildsNothing: a Policy costs one small allocation until it
// answers (a rules file may hold a hundred thousand that never do), and its
// first answers, racing, all come out right.
func TestNewPolicyBuildsNothing(t *testing.T) {
	p := store.Policy{Name: "p", Rate: 7.0 / 86400, Burst: 300}
	assert.Equal(t, 1.0, testing.AllocsPerRun(100, func() { policySink = NewPolicy(p) }))

	e := NewPolicy(store.Policy{Name: "fast", Rate: 100, Burst: 300})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			h := http.Header{}
			e.SetHeaders(h, store.Result{Allowed: true, Remaining: float64(i % 2), ResetAfter: 5 * time.Millisecond})
			assert.Equal(t, `"fast";r=`+strconv.Itoa(i%2)+`;t=1`, h.Get("RateLimit"))
			assert.Equal(t, `"fast";q=100;w=1;sluice-burst=300`, h.Get("RateLimit-Policy"))
			assert.Equal(t, "300", h.Get("X-RateLimit-Limit"))
		})
	}
	wg.Wait()
}
