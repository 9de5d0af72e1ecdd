package httplimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/sluice-go/sluice/adapt"
	"github.com/sluice-go/sluice/sched"
	"github.com/sluice-go/sluice/semaphore"
)

// Limiter is what a Transport waits on before each request. A
// *ratelimiter.Limiter is one; so is anything else that blocks until n units
// may go and, when ctx ends first, returns ctx's error and takes nothing (a
// Transport ends its head's wait that way when the upstream asks for a
// hold).
type Limiter interface {
	Acquire(ctx context.Context, n int) error
}

// rateSetter and burstSetter are the optional parts of a Limiter that
// AdaptToPolicy uses (a *ratelimiter.Limiter has both); a limiter without
// them is left alone.
type rateSetter interface {
	Rate() float64
	SetRate(rate float64) error
}

type burstSetter interface {
	Burst() int
	SetBurst(burst int) error
}

// MaxHold caps how long a Retry-After or RateLimit field can hold a
// Transport's queue: a server that answers "come back in a year" gets an
// hour, and a caller's ctx deadline ends the wait sooner anyway. Every
// figure that means "later" holds, however large: a Retry-After or a
// RateLimit t= with more digits than an int64 has holds, as any figure over
// an hour does, for MaxHold, never for nothing.
const MaxHold = time.Hour

// ErrHeldPastDeadline is returned, wrapped together with
// context.DeadlineExceeded, by a request whose ctx deadline comes before the
// end of a hold the upstream asked for: it fails at once instead of waiting
// for a certain timeout.
var ErrHeldPastDeadline = errors.New("httplimit: upstream asked us to wait past the request's deadline")

// RoundTripper is an http.RoundTripper that waits its turn on a Limiter
// before each request and honours the upstream's requests to back off.
// Create it with Transport; it is safe for concurrent use.
//
// Each request waits, in arrival order, first for any hold the upstream
// asked for, then for one unit of the limiter, then goes out through the
// base transport. A request whose ctx ends while it waits returns ctx's
// error and sends nothing; it leaves the queue at once, holds no place in it
// and, if it was waiting on the limiter, no token (the limiter hands them
// on). A hold that begins while the head of the queue waits on the limiter
// sends it back to wait out the hold first and take its token after, so no
// token is held through a hold: a request cancelled during one takes
// nothing with it, and as a hold ends no more than the limiter's burst
// leaves at once. The one exception is a race: a hold that begins in the
// instant between the limiter's grant and the request leaving (a response
// landing on another goroutine just then) makes the request wait out the
// hold with its token, and if its ctx ends during that hold, the token is
// spent (a Limiter has no way to take one back). When every request is sent
// from fibers of one sched.Run loop this race cannot happen.
//
// A 429 or 503 response that says when to come back (Retry-After, in
// seconds or as an HTTP date, or else a RateLimit field with r=0 and t
// seconds, per draft-ietf-httpapi-ratelimit-headers-12) starts a hold: no
// request leaves before that instant, and the queue keeps its order through
// it. The response itself is returned to the caller, never retried, unless
// Retry asks for retries.
//
// Inside a sched.Run loop the waits park the fiber on the loop's clock and
// the base round trip runs through sched.Blocking, so other fibers go on;
// read the response body inside sched.Blocking as well. Outside a loop waits
// use real time (or a testing/synctest bubble's time).
type RoundTripper struct {
	base    http.RoundTripper
	lim     Limiter
	gate    *semaphore.Semaphore // FIFO: the head waits out holds, then takes its token
	retries int
	adapt   bool
	floor   float64 // with AdaptToPolicy alone: the lowest rate a policy may set (see PolicyFloorFactor)

	// With Adaptive: the bounds and logger given, and the law made from
	// them once every option is in (nil if the limiter has no SetRate).
	lawSet         bool
	lawMin, lawMax float64
	lawLog         *slog.Logger
	law            *adapt.Law

	mu    sync.Mutex
	until time.Time               // guarded by mu; no request leaves before it
	abort context.CancelCauseFunc // guarded by mu; ends the head's wait on the limiter (see take)
}

// TransportOption configures Transport.
type TransportOption func(*RoundTripper)

// Retry makes a Transport retry a request answered 429 or 503 up to max
// times, waiting out each hold and its turn on the limiter again, but only
// for idempotent methods (GET, HEAD, OPTIONS, TRACE, PUT, DELETE) whose body
// can be replayed (none, or Request.GetBody set). The last answer is
// returned as it came. Without Retry, nothing is retried.
func Retry(max int) TransportOption {
	return func(t *RoundTripper) { t.retries = max }
}

// PolicyFloorFactor bounds how far AdaptToPolicy lowers a limiter's rate:
// never below the rate the limiter had when Transport was called, divided
// by this factor. Why a floor: the upstream may be broken or hostile, and a
// policy of one request in 31 years (q=1;w=1000000000) taken as it says
// would stop the client for good, with no answer ever coming to undo it. A
// real policy lower than the floor is still enforced by the upstream: its
// 429s and Retry-After hold the Transport as any throttle does.
const PolicyFloorFactor = 100

// AdaptToPolicy lowers the limiter's rate (and burst) to what the upstream
// advertises in RateLimit-Policy ("name";q=Q;w=W is Q/W requests a second;
// sluice-burst=B a burst), when the limiter has SetRate (SetBurst) and the
// advertised figure is lower than its own. It never raises them, and never
// lowers the rate below the limiter's rate at Transport divided by
// PolicyFloorFactor (the burst stays at least 1).
//
// With Adaptive as well, the control law alone sets the rate: the
// advertised rate is its ceiling, and min its floor (Adaptive reads the
// policy with or without this option); AdaptToPolicy then adds only the
// burst.
func AdaptToPolicy() TransportOption {
	return func(t *RoundTripper) { t.adapt = true }
}

// Adaptive makes the Transport find the upstream's rate by itself: the
// limiter's rate (when it has SetRate, as a *ratelimiter.Limiter does; any
// other limiter is left alone) starts where it is and then follows what the
// upstream accepts, by the control law of package adapt (adapt.Law). It rises
// while answers are clean, and falls on a 429, on a 503 with Retry-After and
// on a RateLimit field with r=0; it never leaves [min, max] and never
// exceeds a rate advertised in RateLimit-Policy (Q/W). Holds work as without
// it: every answer that holds the queue still does. Other answers (a 500, a
// network error) say nothing about the rate and change nothing.
//
// The rate is logged (slog.Default, level Info, unless AdaptiveLog says
// otherwise) each time it moves by more than a factor of 2 from the rate
// last logged; RoundTripper.Law gives the law itself, for its Rate.
// Transport panics on bounds that are not 0 < min ≤ max.
func Adaptive(min, max float64) TransportOption {
	return func(t *RoundTripper) { t.lawSet, t.lawMin, t.lawMax = true, min, max }
}

// AdaptiveLog sends Adaptive's log lines to l (nil: none at all).
func AdaptiveLog(l *slog.Logger) TransportOption {
	return func(t *RoundTripper) {
		if l == nil {
			l = slog.New(slog.DiscardHandler)
		}
		t.lawLog = l
	}
}

// Law returns the control law the Adaptive option set up, or nil (no
// Adaptive option, or a limiter without SetRate).
func (t *RoundTripper) Law() *adapt.Law { return t.law }

// Transport returns a RoundTripper that sends requests through base
// (http.DefaultTransport when nil), each after one unit of lim.
//
//	client := &http.Client{Transport: httplimit.Transport(nil, limiter)}
func Transport(base http.RoundTripper, lim Limiter, opts ...TransportOption) *RoundTripper {
	if lim == nil {
		panic("httplimit: Transport with a nil Limiter")
	}
	if base == nil {
		base = http.DefaultTransport
	}
	t := &RoundTripper{base: base, lim: lim, gate: semaphore.New(1)}
	for _, o := range opts {
		o(t)
	}
	if rs, ok := lim.(rateSetter); ok && t.adapt {
		t.floor = rs.Rate() / PolicyFloorFactor
	}
	if rs, ok := lim.(rateSetter); ok && t.lawSet {
		law, err := adapt.New(rs, t.lawMin, t.lawMax, adapt.LogChanges(t.lawLog, 2))
		if err != nil {
			panic("httplimit: " + err.Error())
		}
		t.law = law
	}
	return t
}

// RoundTrip implements http.RoundTripper.
func (t *RoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	retryable := t.retries > 0 && idempotent(req.Method) && (req.Body == nil || req.Body == http.NoBody || req.GetBody != nil)
	out := req
	for attempt := 0; ; attempt++ {
		if err := t.wait(ctx); err != nil {
			closeBody(out)
			return nil, err
		}
		var resp *http.Response
		sent := sched.Now(ctx)
		err := sched.Blocking(ctx, func() error {
			var err error
			resp, err = t.base.RoundTrip(out)
			return err
		})
		if err != nil {
			return nil, err
		}
		held := t.learn(ctx, resp, sent)
		if !held || !retryable || attempt >= t.retries || ctx.Err() != nil {
			return resp, nil
		}
		next, err := rewind(req)
		if err != nil {
			return resp, nil // cannot replay the body: the answer stands
		}
		// The answer is dropped for a retry: read a little of it so the
		// connection can be reused, then close it.
		_, _ = io.CopyN(io.Discard, resp.Body, 4<<10)
		resp.Body.Close()
		out = next
	}
}

// Hold returns the instant before which no request leaves (zero if the
// upstream never asked for a hold).
func (t *RoundTripper) Hold() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.until
}

// wait takes the caller's turn: through the FIFO gate, past any hold, then
// one unit of the limiter, going back to wait out any hold that begins
// before the unit comes.
func (t *RoundTripper) wait(ctx context.Context) error {
	if err := t.gate.Acquire(ctx, 1); err != nil {
		return err
	}
	defer t.gate.Release(1)
	for {
		if err := t.sleepHold(ctx); err != nil {
			return err
		}
		again, err := t.take(ctx)
		if err != nil {
			return err
		}
		if !again {
			break
		}
	}
	// Only a hold that began in the instant between the limiter's grant and
	// take's last look (a response on another goroutine) is left: the token
	// is ours now, and the request still must not leave early.
	return t.sleepHold(ctx)
}

// errHoldBegan is the cause with which learn ends the head's wait on the
// limiter; it never reaches a caller.
var errHoldBegan = errors.New("httplimit: a hold began")

// take waits for one unit of the limiter. If a hold begins before the unit
// comes, it gives up the wait and reports again: the head then waits out the
// hold holding nothing, and takes its unit after it.
//
// Why not take the unit and then wait out the hold with it: a Limiter has no
// way to take a unit back, so a request cancelled during the hold would
// spend it, and the bucket, refilling to its burst behind a head that
// already holds a unit, would let burst+1 requests leave as the hold ends.
func (t *RoundTripper) take(ctx context.Context) (again bool, err error) {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// Look at the hold and publish cancel under one lock, so a hold that
	// begins after this look ends the wait below.
	t.mu.Lock()
	if t.until.After(sched.Now(ctx)) {
		t.mu.Unlock()
		return true, nil
	}
	t.abort = cancel
	t.mu.Unlock()

	err = t.lim.Acquire(actx, 1)

	t.mu.Lock()
	t.abort = nil
	t.mu.Unlock()
	if err != nil && context.Cause(actx) == errHoldBegan {
		if err := ctx.Err(); err != nil {
			return false, err // ctx ended too: its error, not ours
		}
		return true, nil
	}
	return false, err
}

func (t *RoundTripper) sleepHold(ctx context.Context) error {
	for {
		t.mu.Lock()
		until := t.until
		t.mu.Unlock()
		now := sched.Now(ctx)
		d := until.Sub(now)
		if d <= 0 {
			return nil
		}
		if dl, ok := ctx.Deadline(); ok && dl.Before(until) {
			return fmt.Errorf("%w (held %v more, deadline in %v): %w", ErrHeldPastDeadline,
				d, dl.Sub(now), context.DeadlineExceeded)
		}
		if err := sched.Sleep(ctx, d); err != nil {
			return err
		}
	}
}

// learn reads what resp, to a request sent at sent, says about the
// upstream's limits: it adapts the limiter (with AdaptToPolicy, Adaptive)
// and, for a 429 or 503 that says when to come back, starts or extends the
// hold, reporting whether it did.
func (t *RoundTripper) learn(ctx context.Context, resp *http.Response, sent time.Time) bool {
	if t.adapt {
		t.adaptTo(resp.Header)
	}
	now := sched.Now(ctx)
	code := resp.StatusCode
	// The draft (§7): when both are present, Retry-After takes precedence.
	d, ok := retryAfter(resp.Header, now)
	if !ok {
		d, ok = rateLimitWait(resp.Header)
	}
	if t.law != nil {
		t.feed(resp, sent, now, d, ok)
	}
	if code != http.StatusTooManyRequests && code != http.StatusServiceUnavailable {
		return false
	}
	if !ok {
		return false
	}
	until := now.Add(min(d, MaxHold))
	var abort context.CancelCauseFunc
	t.mu.Lock()
	if until.After(t.until) {
		t.until, abort = until, t.abort
	}
	t.mu.Unlock()
	if abort != nil {
		abort(errHoldBegan) // the head waits out the hold before its token
	}
	return true
}

// retryAfter parses Retry-After: delay-seconds, or an HTTP-date taken
// relative to the response's own Date when it has one (so clock skew between
// us and the server does not matter). Every "later" it returns is at most
// MaxHold, however far off the figure or the date (time.Time.Sub saturates;
// a four-digit year cannot overflow it); a date already past is no wait.
func retryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	// Digits however many: a figure too large for any integer type is a
	// long wait (MaxHold), not a value to ignore, which would mean none.
	if n, ok := parseDigits(v); ok {
		return time.Duration(min(n, int64(MaxHold/time.Second))) * time.Second, true
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	ref := now
	if date, err := http.ParseTime(h.Get("Date")); err == nil {
		ref = date
	}
	return min(max(0, at.Sub(ref)), MaxHold), true
}

// rateLimitWait reads the RateLimit field: the longest t among the service
// limits with nothing remaining (r=0). Malformed fields are ignored, as the
// draft requires.
func rateLimitWait(h http.Header) (time.Duration, bool) {
	var wait int64 = -1
	for _, it := range parseSFList(h.Values("Ratelimit")) {
		r, rok := it.params["r"]
		tt, tok := it.params["t"]
		if rok && tok && r == 0 {
			wait = max(wait, tt)
		}
	}
	if wait < 0 {
		return 0, false
	}
	return time.Duration(min(wait, int64(MaxHold/time.Second))) * time.Second, true
}

// feed tells the control law what resp says: a throttle (a 429; a 503 that
// says when to come back; any answer whose RateLimit field has r=0), or a
// clean answer (below 500), under any ceiling RateLimit-Policy advertises.
// wait and waitOK are the hold resp asks for, as learn read it.
func (t *RoundTripper) feed(resp *http.Response, sent, now time.Time, wait time.Duration, waitOK bool) {
	if rate, _, ok := policyOf(resp.Header); ok && !math.IsInf(rate, 1) {
		t.law.SetCeiling(rate)
	}
	code := resp.StatusCode
	_, exhausted := rateLimitWait(resp.Header)
	switch {
	case code == http.StatusTooManyRequests, code == http.StatusServiceUnavailable && waitOK, exhausted:
		if !waitOK {
			wait = 0
		}
		t.law.Throttled(sent, now, wait)
	case code < 500:
		t.law.OK(sent, now)
	}
}

// policyOf reads RateLimit-Policy: the lowest rate (Q/W) and burst
// (sluice-burst) among its policies, +Inf and MaxInt64 where none says.
func policyOf(h http.Header) (rate float64, burst int64, ok bool) {
	items := parseSFList(h.Values("Ratelimit-Policy"))
	if len(items) == 0 {
		return 0, 0, false
	}
	rate, burst = math.Inf(1), int64(math.MaxInt64)
	for _, it := range items {
		q, qok := it.params["q"]
		w, wok := it.params["w"]
		if qok && wok && q > 0 && w > 0 {
			rate = min(rate, float64(q)/float64(w))
		}
		if b, ok := it.params["sluice-burst"]; ok && b > 0 {
			burst = min(burst, b)
		}
	}
	return rate, burst, true
}

func (t *RoundTripper) adaptTo(h http.Header) {
	rate, burst, ok := policyOf(h)
	if !ok {
		return
	}
	// Why not with Adaptive: one owner of the rate. A write here would go
	// around the law, which bounds the rate to [min, max] and would not see
	// it (feed hands the policy to the law as a ceiling instead).
	if rs, ok := t.lim.(rateSetter); ok && t.law == nil && !math.IsInf(rate, 1) {
		if rate = max(rate, t.floor); rate < rs.Rate() {
			_ = rs.SetRate(rate) // a rate the limiter refuses leaves it as it was
		}
	}
	if bs, ok := t.lim.(burstSetter); ok && burst < int64(bs.Burst()) {
		_ = bs.SetBurst(int(burst))
	}
}

func idempotent(method string) bool {
	switch method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

// rewind returns a copy of req to send again, with a fresh body.
func rewind(req *http.Request) (*http.Request, error) {
	next := req.Clone(req.Context())
	if req.Body == nil || req.Body == http.NoBody {
		return next, nil
	}
	body, err := req.GetBody()
	if err != nil {
		return nil, err
	}
	next.Body = body
	return next, nil
}

// closeBody closes a request body the base transport never got: a
// RoundTripper must close it even on error.
func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}
