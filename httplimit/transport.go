package httplimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
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
