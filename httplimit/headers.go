package httplimit

import (
	"math"
	"net/http"
	"strings"
	"time"
)

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
