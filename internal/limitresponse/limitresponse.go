// Package limitresponse writes a rate-limit decision as an HTTP response: the
// IETF RateLimit and RateLimit-Policy fields, the X-RateLimit-* fields,
// Retry-After, and the JSON body that `sluice serve` answers /allow with.
// The service and the httplimit middleware both write through it, so the two
// never answer the same decision differently.
//
// The fields follow draft-ietf-httpapi-ratelimit-headers-12 (its
// RateLimit-Policy (§3) and RateLimit (§4) definitions read as in -11):
//
//   - RateLimit-Policy: "name";q=Q;w=W;sluice-burst=B. q is a quota in
//     requests per window of w whole seconds, so q/w is the policy's rate
//     exactly (w is the smallest whole window in which the rate is a whole
//     number of requests). A token bucket also has a burst, which the draft
//     has no parameter for; §3.1 asks for a vendor-prefixed parameter for
//     such things ("acme-burst"), hence sluice-burst.
//   - RateLimit: "name";r=R;t=T. r is the whole tokens in the bucket now; t
//     is the draft's "effective window": the seconds within which the client
//     can use no more than r, which for a token bucket is the time until the
//     next whole token is credited.
//
// Whole seconds cannot say "the next token comes in 10 ms", so every figure
// is rounded the way that never invites a request the server would refuse
// (the draft's §6 forbids advertising more than is allowed): r down, t and
// Retry-After up. Retry-After is therefore never earlier than the end of the
// effective window, as §6 asks.
package limitresponse

import (
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/store"
)

// cachedTokens is how many remaining-token counts get their header values
// built once, so the common responses allocate nothing for them.
const cachedTokens = 256

// tokenText[r] is the text of r whole tokens, shared by every policy: the
// X-RateLimit-Remaining value for r, and X-RateLimit-Limit for a burst r.
var tokenText = func() (t [cachedTokens][]string) {
	for r := range t {
		t[r] = []string{strconv.Itoa(r)}
	}
	return t
}()

// Policy is one store.Policy with its header values, built at its first
// response. It is read-only after NewPolicy as far as callers can tell, and
// safe for concurrent use.
//
// Why built late: a rules file can hold a hundred thousand rules, each a
// Policy, most of which may never answer a request; the text of a policy
// that answers (a few hundred bytes, plus one RateLimit value per
// remaining count seen) costs nothing until it does. NewPolicy itself costs
// a small struct.
type Policy struct {
	p        store.Policy
	interval time.Duration
	text     atomic.Pointer[policyText] // nil until the first response
}

// policyText is a policy's constant header values. Once published it is
// never modified, except for rateLimit1's entries, each set once.
type policyText struct {
	nameSF     string
	policyHdr  []string // RateLimit-Policy
	limitHdr   []string // X-RateLimit-Limit
	policyJSON string   // the body's `,"limit":B,"rate":R`
	// rateLimit1[r] is RateLimit for r tokens and t=1, the only t a policy
	// with rate ≥ 1 ever sends (nil for slower policies), built at the
	// first response that sends it: a policy pays for the counts it sends.
	rateLimit1 []atomic.Pointer[[]string]
}

var (
	jsonCT  = []string{"application/json"}
	noStore = []string{"no-store"}
	one     = []string{"1"}
)

// NewPolicy returns the response writer of p, which must be valid
// (store.Policy.Validate) and named. It builds no header text: that waits
// for the first response.
func NewPolicy(p store.Policy) *Policy {
	return &Policy{p: p, interval: p.Interval()}
}

// txt returns e's header text, building it on first use. Two goroutines
// may both build it; one result is kept, and both are the same text.
func (e *Policy) txt() *policyText {
	if t := e.text.Load(); t != nil {
		return t
	}
	p := e.p
	t := &policyText{nameSF: sfString(p.Name), policyHdr: []string{PolicyField(p)}}
	if p.Burst < cachedTokens {
		t.limitHdr = tokenText[p.Burst]
	} else {
		t.limitHdr = []string{strconv.FormatInt(p.Burst, 10)}
	}
	t.policyJSON = `,"limit":` + strconv.FormatInt(p.Burst, 10) + `,"rate":` + strconv.FormatFloat(p.Rate, 'f', -1, 64)
	if e.interval <= time.Second {
		t.rateLimit1 = make([]atomic.Pointer[[]string], min(p.Burst, cachedTokens-1)+1)
	}
	if !e.text.CompareAndSwap(nil, t) {
		return e.text.Load()
	}
	return t
}

// rateLimit1For returns the RateLimit value for r tokens and t=1 from the
// cache, building it on first use; nil if the policy caches no such value.
func (t *policyText) rateLimit1For(r int64) []string {
	if r < 0 || r >= int64(len(t.rateLimit1)) {
		return nil
	}
	slot := &t.rateLimit1[r]
	if v := slot.Load(); v != nil {
		return *v
	}
	v := []string{string(t.appendRateLimitField(nil, r, 1))}
	slot.CompareAndSwap(nil, &v)
	return *slot.Load()
}

// Policy returns the store.Policy p was built from.
func (e *Policy) Policy() store.Policy { return e.p }

// PolicyField returns p's RateLimit-Policy field value (see the package doc).
func PolicyField(p store.Policy) string {
	q, w := quotaWindow(p.Rate)
	return sfString(p.Name) + ";q=" + strconv.FormatInt(q, 10) + ";w=" + strconv.FormatInt(w, 10) +
		";sluice-burst=" + strconv.FormatInt(p.Burst, 10)
}

// maxWindow is the longest window quotaWindow searches for an exact quota:
// a day.
const maxWindow = 86400

// quotaWindow returns a whole quota q and window w (seconds, ≥ 1) with q/w
// equal to rate: the smallest such w up to a day. A rate with no exact
// quota within a day (an irrational-looking float) gets the day, or, if
// under one request a day, the window of one request; q is rounded down
// then, so the advertised rate is never above the real one.
func quotaWindow(rate float64) (q, w int64) {
	for w := int64(1); w <= maxWindow; w++ {
		x := rate * float64(w)
		r := math.Round(x)
		if r >= 1 && math.Abs(x-r) <= 1e-9*r {
			return int64(r), w
		}
	}
	if x := rate * maxWindow; x >= 1 {
		return int64(x), maxWindow
	}
	return 1, int64(math.Ceil(1 / rate))
}

func (t *policyText) appendRateLimitField(b []byte, r, secs int64) []byte {
	b = append(b, t.nameSF...)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, r, 10)
	b = append(b, ";t="...)
	return strconv.AppendInt(b, secs, 10)
}

// wholeTokens rounds remaining down: to a thousandth first (the figure the
// JSON body reports), then to a whole token.
func wholeTokens(remaining float64) (thousandths float64, whole int64) {
	thousandths = math.Floor(max(remaining, 0)*1000) / 1000
	return thousandths, int64(thousandths)
}

// nextToken is how long until the bucket holds one more whole token than
// now, with nobody spending: the fraction of an interval left in ResetAfter,
// or a whole interval when the bucket is full (the next token can only come
// one interval after the next spend).
func (e *Policy) nextToken(res store.Result) time.Duration {
	d := res.ResetAfter % e.interval
	if d <= 0 {
		d = e.interval
	}
	return d
}

// SetHeaders sets the rate-limit fields of a decision on h: X-RateLimit-Limit,
// X-RateLimit-Remaining, RateLimit-Policy, RateLimit, and Retry-After for a
// denial. Past the policy's first response with the same remaining count,
// it allocates nothing for up to 255 remaining tokens on a policy of rate
// ≥ 1/s, and two allocations otherwise, however many values it had to build
// (see valueText).
func (e *Policy) SetHeaders(h http.Header, res store.Result) {
	txt := e.txt()
	_, r := wholeTokens(res.Remaining)
	t := ceilDiv(e.nextToken(res), time.Second)
	// Direct map writes with canonical keys and shared constant values: the
	// hot path skips canonicalisation and an allocation per header.
	h["X-Ratelimit-Limit"] = txt.limitHdr
	h["Ratelimit-Policy"] = txt.policyHdr
	var arr [128]byte
	v := valueText{buf: arr[:0]}
	iRemaining, iRateLimit, iRetry := -1, -1, -1
	if r < cachedTokens {
		h["X-Ratelimit-Remaining"] = tokenText[r]
	} else {
		v.buf = strconv.AppendInt(v.buf, r, 10)
		iRemaining = v.end()
	}
	var rl []string
	if t == 1 {
		rl = txt.rateLimit1For(r)
	}
	if rl != nil {
		h["Ratelimit"] = rl
	} else {
		v.buf = txt.appendRateLimitField(v.buf, r, t)
		iRateLimit = v.end()
	}
	switch s := max(1, ceilDiv(res.RetryAfter, time.Second)); {
	case res.Allowed:
		delete(h, "Retry-After")
	case s == 1:
		h["Retry-After"] = one
	default:
		v.buf = strconv.AppendInt(v.buf, s, 10)
		iRetry = v.end()
	}
	if v.n == 0 {
		return
	}
	vals := v.strings()
	if iRemaining >= 0 {
		h["X-Ratelimit-Remaining"] = vals[iRemaining : iRemaining+1 : iRemaining+1]
	}
	if iRateLimit >= 0 {
		h["Ratelimit"] = vals[iRateLimit : iRateLimit+1 : iRateLimit+1]
	}
	if iRetry >= 0 {
		h["Retry-After"] = vals[iRetry : iRetry+1 : iRetry+1]
	}
}

// valueText gathers the header values of one response that no cache holds
// in a buffer on the caller's stack and hands them out as substrings of one
// string: two allocations (the string, and the []string the values share)
// instead of two or three per value. Each value becomes vals[i:i+1:i+1],
// capped so nobody's append can reach a neighbour.
type valueText struct {
	buf  []byte
	ends [3]int
	n    int
}

// end closes the value written since the previous end and returns its index.
func (v *valueText) end() int {
	v.ends[v.n] = len(v.buf)
	v.n++
	return v.n - 1
}

// strings returns the values, in order, as substrings of one string.
func (v *valueText) strings() []string {
	s := string(v.buf)
	vals := make([]string, v.n)
	start := 0
	for i, end := range v.ends[:v.n] {
		vals[i] = s[start:end]
		start = end
	}
	return vals
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 192); return &b }}

// WriteDecision writes the whole response for a decision: the fields of
// SetHeaders, Content-Type and Cache-Control, status 200 (allowed) or 429
// (denied), and the JSON body
//
//	{"allowed":true,"remaining":9,"limit":10,"rate":10}
//	{"allowed":false,"remaining":0.3,"limit":10,"rate":10,"retry_after_ms":70}
//
// shadowDenied answers a denial as allowed (status 200, no Retry-After) with
// "shadow_denied":true in the body.
func (e *Policy) WriteDecision(w http.ResponseWriter, res store.Result, shadowDenied bool) {
	h := w.Header()
	h["Content-Type"] = jsonCT
	h["Cache-Control"] = noStore
	e.SetHeaders(h, res)
	remaining, _ := wholeTokens(res.Remaining)

	bp := bufPool.Get().(*[]byte)
	b := (*bp)[:0]
	if res.Allowed || shadowDenied {
		b = append(b, `{"allowed":true,"remaining":`...)
	} else {
		b = append(b, `{"allowed":false,"remaining":`...)
	}
	if whole := int64(remaining); float64(whole) == remaining {
		b = strconv.AppendInt(b, whole, 10) // the same text as AppendFloat's, for less work
	} else {
		b = strconv.AppendFloat(b, remaining, 'f', -1, 64)
	}
	b = e.appendPolicy(b)
	status := http.StatusOK
	if !res.Allowed {
		// Rounded up: a client that waits what we say must find the token there.
		b = append(b, `,"retry_after_ms":`...)
		b = strconv.AppendInt(b, max(1, ceilDiv(res.RetryAfter, time.Millisecond)), 10)
		if shadowDenied {
			b = append(b, `,"shadow_denied":true`...)
			delete(h, "Retry-After")
		} else {
			status = http.StatusTooManyRequests
		}
	}
	b = append(b, "}\n"...)
	w.WriteHeader(status)
	_, _ = w.Write(b)
	*bp = b
	bufPool.Put(bp)
}

// SetDegradedHeaders sets the fields a response carries when the store could
// not decide. The policy is known, the bucket is not: RateLimit-Policy and
// X-RateLimit-Limit always; failing closed also says what the denial means,
// r=0 for the Retry-After of one second (RateLimit, X-RateLimit-Remaining,
// Retry-After: 1). Failing open sends no RateLimit: the draft lets a server
// omit it, and any figure would be invented.
func (e *Policy) SetDegradedHeaders(h http.Header, failOpen bool) {
	txt := e.txt()
	h["X-Ratelimit-Limit"] = txt.limitHdr
	h["Ratelimit-Policy"] = txt.policyHdr
	if failOpen {
		return
	}
	h["X-Ratelimit-Remaining"] = tokenText[0]
	h["Ratelimit"] = []string{string(txt.appendRateLimitField(nil, 0, 1))}
	h["Retry-After"] = one
}

// WriteDegraded writes the whole response for a request the store could not
// decide: SetDegradedHeaders, then status 200 with
// {"allowed":true,...,"degraded":"store unavailable; failing open"} or 429
// with {"allowed":false,...,"retry_after_ms":1000,"degraded":"store
// unavailable; failing closed"}.
func (e *Policy) WriteDegraded(w http.ResponseWriter, failOpen bool) {
	h := w.Header()
	h["Content-Type"] = jsonCT
	h["Cache-Control"] = noStore
	e.SetDegradedHeaders(h, failOpen)
	b := make([]byte, 0, 192)
	status := http.StatusOK
	if failOpen {
		b = append(b, `{"allowed":true`...)
		b = e.appendPolicy(b)
		b = append(b, `,"degraded":"store unavailable; failing open"}`...)
	} else {
		b = append(b, `{"allowed":false`...)
		b = e.appendPolicy(b)
		b = append(b, `,"retry_after_ms":1000,"degraded":"store unavailable; failing closed"}`...)
		status = http.StatusTooManyRequests
	}
	b = append(b, '\n')
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func (e *Policy) appendPolicy(b []byte) []byte { return append(b, e.txt().policyJSON...) }

// WriteError writes {"error": msg} with status, as JSON.
func WriteError(w http.ResponseWriter, status int, msg string) {
	b, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{msg})
	b = append(b, '\n')
	h := w.Header()
	h["Content-Type"] = jsonCT
	h["Cache-Control"] = noStore
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func ceilDiv(d, unit time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + unit - 1) / unit)
}

// sfString quotes s as an RFC 9651 structured-field string. Policy names are
// printable ASCII: every caller checks them with CheckName.
func sfString(s string) string {
	b := make([]byte, 0, len(s)+2)
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return string(append(b, '"'))
}
