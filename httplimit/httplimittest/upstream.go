// Package httplimittest provides a simulated rate-limited upstream for
// tests of HTTP clients: an http.RoundTripper that answers in memory, with
// no sockets, behind a GCRA quota that changes on a schedule.
//
// Its time is the request context's clock (sched.Now): a sched.Run loop's
// virtual clock for fibers, a testing/synctest bubble's clock inside one,
// real time otherwise. Under a virtual clock, fifteen minutes of traffic run
// in well under a second of real time, and the same program with the same
// seed makes the same run.
package httplimittest

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/sluice-go/sluice/internal/loopctx"
	"github.com/sluice-go/sluice/sched"
)

// Quota gives the rate, in requests a second, the upstream grants this
// client at elapsed time since its start.
type Quota func(elapsed time.Duration) float64

// Step is one change of a Steps quota: from At on, Rate.
type Step struct {
	At   time.Duration
	Rate float64
}

// Steps returns a Quota of initial until the first step, then each step's
// rate from its At on (steps in order of At).
func Steps(initial float64, steps ...Step) Quota {
	return func(e time.Duration) float64 {
		r := initial
		for _, s := range steps {
			if e < s.At {
				break
			}
			r = s.Rate
		}
		return r
	}
}

// Upstream is a simulated API with a token bucket (GCRA) quota of Burst
// requests refilled at Quota(elapsed) a second. A request that finds a
// token is answered 200; one that finds none is answered 429 Too Many
// Requests with Retry-After in whole seconds, rounded up (so at least 1),
// as most servers send it. Create it with New; it is safe for concurrent
// use. By default the answer is decided the instant RoundTrip is called: the
// upstream has no latency (see Latency).
type Upstream struct {
	quota  Quota
	burst  float64
	policy bool
	res    time.Duration
	delay  time.Duration // each way

	mu      sync.Mutex
	start   time.Time // zero until the first request
	last    time.Duration
	tokens  float64
	served  []int64 // per slot of res
	refused []int64
}

// Option configures New.
type Option func(*Upstream)

// Burst sets the bucket's size (default: the quota at the start times one
// second, at least 1).
func Burst(n float64) Option { return func(u *Upstream) { u.burst = n } }

// AdvertisePolicy makes every answer carry a RateLimit-Policy field with
// the quota in force ("quota";q=Q;w=1, Q rounded down, at least 1).
func AdvertisePolicy() Option { return func(u *Upstream) { u.policy = true } }

// Resolution sets the width of the slots Served and Refused count in
// (default 100 ms).
func Resolution(d time.Duration) Option { return func(u *Upstream) { u.res = d } }

// Latency makes each request reach the upstream d/2 after RoundTrip is
// called and its answer come back d/2 after that, so requests overlap in
// flight. The waits are on real time, or a testing/synctest bubble's time:
// inside a sched.Run loop the Transport calls RoundTrip through
// sched.Blocking, which cannot wait on the loop's clock, so there
// RoundTrip returns ErrLatencyInLoop.
func Latency(d time.Duration) Option { return func(u *Upstream) { u.delay = d / 2 } }

// ErrLatencyInLoop is returned by RoundTrip of an Upstream with Latency
// called from a sched.Run loop.
var ErrLatencyInLoop = errors.New("httplimittest: Latency needs plain goroutines (not a sched.Run loop)")

// StartAt fixes the instant elapsed time counts from (default: the first
// request).
func StartAt(t time.Time) Option { return func(u *Upstream) { u.start = t } }

// New returns an Upstream with quota q; its bucket starts full.
func New(q Quota, opts ...Option) *Upstream {
	u := &Upstream{quota: q, res: 100 * time.Millisecond}
	for _, o := range opts {
		o(u)
	}
	if u.burst == 0 {
		u.burst = max(1, q(0))
	}
	u.tokens = u.burst
	return u
}

// RoundTrip implements http.RoundTripper: it decides at once, by the
// request context's clock.
func (u *Upstream) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
	ctx := req.Context()
	if u.delay > 0 {
		if loopctx.InLoop(ctx) {
			return nil, ErrLatencyInLoop
		}
		if err := sched.Sleep(ctx, u.delay); err != nil { // not a loop's ctx: a timer
			return nil, err
		}
	}
	ok, q, wait := u.decide(sched.Now(ctx))
	if u.delay > 0 {
		// The answer is on its way back: it arrives even if ctx ends now,
		// as a response already sent would.
		time.Sleep(u.delay)
	}
	h := http.Header{}
	if u.policy {
		h.Set("RateLimit-Policy", fmt.Sprintf(`"quota";q=%d;w=1`, max(1, int64(q))))
	}
	code := http.StatusOK
	if !ok {
		code = http.StatusTooManyRequests
		secs := int64(math.Ceil(wait.Seconds()))
		h.Set("Retry-After", strconv.FormatInt(max(1, secs), 10))
	}
	return &http.Response{
		Status:     fmt.Sprintf("%d %s", code, http.StatusText(code)),
		StatusCode: code,
		Proto:      "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:  h,
		Body:    http.NoBody,
		Request: req,
	}, nil
}

// decide takes a token if there is one, reporting the quota in force and,
// when there is none, how long until there is.
func (u *Upstream) decide(now time.Time) (ok bool, q float64, wait time.Duration) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.start.IsZero() {
		u.start = now
	}
	e := max(now.Sub(u.start), u.last)
	// Refill at the quota in force at the last decision: decisions are far
	// more frequent than changes of the quota, so the error is one gap.
	q = u.quota(u.last)
	u.tokens = min(u.burst, u.tokens+q*(e-u.last).Seconds())
	u.last = e
	q = u.quota(e)
	slot := int(e / u.res)
	for len(u.served) <= slot {
		u.served = append(u.served, 0)
		u.refused = append(u.refused, 0)
	}
	if u.tokens >= 1 {
		u.tokens--
		u.served[slot]++
		return true, q, 0
	}
	u.refused[slot]++
	if q <= 0 {
		return false, q, time.Hour
	}
	return false, q, time.Duration((1 - u.tokens) / q * float64(time.Second))
}

// Resolution returns the width of the slots of Served and Refused.
func (u *Upstream) Resolution() time.Duration { return u.res }

// Served returns the requests answered 200 in each slot since the start.
func (u *Upstream) Served() []int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]int64(nil), u.served...)
}

// Refused returns the requests answered 429 in each slot since the start.
func (u *Upstream) Refused() []int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]int64(nil), u.refused...)
}
