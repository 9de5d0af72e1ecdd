package httplimit

import (
	"log/slog"
	"math"
	"net/http"
	"time"

	"github.com/sluice-go/sluice/adapt"
)

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
