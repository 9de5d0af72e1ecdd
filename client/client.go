// Package client asks a sluice rate-limit service (`sluice serve`) whether
// work may proceed, and waits across the network when it may not yet.
//
//	c, err := client.New("http://127.0.0.1:8100", client.WithTimeout(200*time.Millisecond))
//	...
//	if err := c.Acquire(ctx, "tenant-a", 1); err != nil {
//		return err // ctx ended, or the wait would pass ctx's deadline
//	}
//
// The service is a dependency on the request path, so every call is bounded
// by a per-call timeout and what an unreachable service means is the
// caller's choice: store.FailOpen (proceed) or store.FailClosed (refuse). A
// key the service denied for R is not asked about again until R has passed (the
// local deny cache), so a flooding caller costs the service nothing while it
// waits. The cache keeps each clock apart: a denial cached in a sched.Run
// loop (on its virtual clock) or a testing/synctest bubble never answers a
// caller on real time, nor the other way round.
//
// Time: as in every package here that waits, the ctx's clock. Acquire's
// waits park a sched.Run fiber on the loop's clock, and block a goroutine
// on real time (a testing/synctest bubble's inside one) otherwise. There is
// no clock option: the service decides, and its retry-after is a duration.
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluice-go/sluice/internal/loopctx"
	"github.com/sluice-go/sluice/internal/monotime"
	"github.com/sluice-go/sluice/sched"
	"github.com/sluice-go/sluice/store"
)

// Source says where a Decision came from.
type Source int

const (
	FromServer   Source = iota // the service decided
	FromCache                  // a denial the service gave earlier, still in force
	FromFailMode               // the service could not answer; the fail mode decided
)

// Decision is the answer to one Allow.
type Decision struct {
	Allowed    bool
	Remaining  float64       // tokens left in the key's bucket, as the service reported
	Limit      int64         // the key's burst
	Rate       float64       // the key's tokens per second
	RetryAfter time.Duration // for a denial: how long until the same request could pass
	Source     Source
	// Degraded is set when the service answered without its store (its own
	// -fail mode decided).
	Degraded string
}

// ErrUnavailable is wrapped by errors from a service that cannot answer:
// network errors, timeouts, 5xx replies, and replies the client cannot use
// (no decision, a denial without a positive retry_after_ms, a retry-after
// beyond any policy, a status that contradicts the body).
var ErrUnavailable = errors.New("client: rate-limit service unavailable")

// ErrWaitPastDeadline is returned (wrapped together with
// context.DeadlineExceeded) by Acquire when the service's retry-after would
// end after ctx's deadline: Acquire gives up at once instead of sleeping to
// a certain failure.
var ErrWaitPastDeadline = errors.New("client: wait would pass the context deadline")

// RequestError is a request the service refused as malformed (4xx other
// than 429): a key too long, n above the burst. Retrying cannot help, and no
// fail mode applies.
type RequestError struct {
	Status  int
	Message string
}

func (e *RequestError) Error() string {
	return fmt.Sprintf("client: service refused the request (%d): %s", e.Status, e.Message)
}

// Client talks to one service. It is safe for concurrent use; its zero value
// is not usable (use New).
type Client struct {
	base    string
	hc      *http.Client
	timeout time.Duration
	fail    store.FailMode
	jitter  float64

	cache *denyCache // nil when disabled
}

// Option configures New.
type Option func(*Client)

// WithHTTPClient sets the HTTP client (default: one with keep-alive
// connections sized for concurrent callers).
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithTimeout bounds each request to the service (default DefaultTimeout;
// 0 means only ctx bounds it). A slow limiter must not make its caller
// slow.
func WithTimeout(d time.Duration) Option { return func(c *Client) { c.timeout = d } }

// WithFailMode sets what an unavailable service means: store.FailOpen (the
// default) allows the work, which protects your users and risks overloading
// what the limit guards; store.FailClosed denies it, which protects the
// backend and turns a limiter outage into your outage.
func WithFailMode(m store.FailMode) Option { return func(c *Client) { c.fail = m } }

// WithJitter sets the largest extra fraction Acquire adds to a retry-after
// (default 0.1: a wait of 100 ms becomes 100–110 ms), so replicas denied
// together do not all come back at the same instant. The wait is never
// shortened, and the extra is at most MaxRetryWait whatever frac.
func WithJitter(frac float64) Option { return func(c *Client) { c.jitter = max(0, frac) } }

// WithoutDenyCache makes every Allow ask the service, even for a key it
// denied a moment ago.
func WithoutDenyCache() Option { return func(c *Client) { c.cache = nil } }

// DefaultTimeout is the per-request timeout when WithTimeout is not given.
// Why 500 ms: it must exceed the service's own store timeout (250 ms by
// default), or a slow store shows up as client timeouts instead of the
// service's answer per its -fail mode.
const DefaultTimeout = 500 * time.Millisecond

// Bounds on the waits Acquire makes between requests, whatever the service
// says.
const (
	// MinRetryWait is the shortest wait: Acquire never asks about a key
	// more often than this, so a service answering "retry after 0" cannot
	// make it spin.
	MinRetryWait = 5 * time.Millisecond
	// MaxRetryWait is the longest single wait: after it, Acquire asks
	// again (a longer retry-after is slept in slices, rechecked each time).
	MaxRetryWait = time.Minute
	// maxRetryAfter is the longest retry-after a valid reply carries: the
	// service's policies refill within store.MaxTolerance (about 52 days).
	maxRetryAfter = time.Duration(1 << 52)
)

// New returns a client of the service at baseURL ("http://HOST:PORT").
func New(baseURL string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: service URL %q: want http://HOST:PORT", baseURL)
	}
	c := &Client{
		base:    strings.TrimRight(baseURL, "/"),
		timeout: DefaultTimeout,
		jitter:  0.1,
		cache:   &denyCache{m: make(map[denyKey]denial)},
	}
	for _, o := range opts {
		o(c)
	}
	if c.hc == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 64
		c.hc = &http.Client{Transport: t}
	}
	return c, nil
}

// Close releases idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

type allowReply struct {
	Allowed      *bool    `json:"allowed"`
	Remaining    float64  `json:"remaining"`
	Limit        int64    `json:"limit"`
	Rate         float64  `json:"rate"`
	RetryAfterMS *float64 `json:"retry_after_ms"` // float: a huge value is an error, not an overflow
	Degraded     string   `json:"degraded"`
	Error        string   `json:"error"`
}

// decision checks a 200 or 429 reply and returns what it says, or why it
// cannot be used.
func (r *allowReply) decision(status int) (Decision, error) {
	if r.Allowed == nil {
		return Decision{}, errors.New(`no "allowed" field`)
	}
	if !(r.Remaining >= 0) {
		// A bucket never holds less than nothing; Store derives a reset
		// time from it, which a negative figure would take past any
		// Duration.
		return Decision{}, fmt.Errorf(`"remaining":%v is negative`, r.Remaining)
	}
	d := Decision{Allowed: *r.Allowed, Remaining: r.Remaining, Limit: r.Limit, Rate: r.Rate, Degraded: r.Degraded}
	if d.Allowed != (status == http.StatusOK) {
		return Decision{}, fmt.Errorf(`status %d with "allowed":%v`, status, d.Allowed)
	}
	if d.Allowed {
		return d, nil
	}
	if r.RetryAfterMS == nil {
		return Decision{}, errors.New(`a denial without "retry_after_ms"`)
	}
	ms := *r.RetryAfterMS
	if !(ms > 0) || ms*float64(time.Millisecond) > float64(maxRetryAfter) { // !(>) catches NaN
		return Decision{}, fmt.Errorf(`"retry_after_ms":%v is not a usable wait`, ms)
	}
	d.RetryAfter = time.Duration(math.Ceil(ms * float64(time.Millisecond)))
	return d, nil
}

// Allow asks whether n units of work on key may proceed now; it never waits
// beyond one request (bounded by the client's timeout and ctx).
//
// When the service cannot answer, Allow returns the fail mode's decision
// (Source FromFailMode) together with an error wrapping ErrUnavailable, so
// callers may act on the decision and still count the error. A malformed
// request returns a *RequestError. If ctx ends first, Allow returns
// ctx.Err() and a denial.
func (c *Client) Allow(ctx context.Context, key string, n int64) (Decision, error) {
	// ctx's clock: the loop's inside a sched.Run loop, so that a denial
	// cached at a virtual instant ends at a virtual instant too.
	now := sched.Now(ctx)
	dom := domainOf(ctx)
	// Bad input goes to the service whatever the cache holds, so that it
	// gets its *RequestError: n < 1 never matches a cached denial, and a
	// cached denial never answers n above the burst it reported.
	if d, ok := c.cache.get(dom, key, n, now); ok {
		return Decision{RetryAfter: d.until.Sub(now), Limit: d.limit, Rate: d.rate, Source: FromCache}, nil
	}
	rctx := ctx
	if c.timeout > 0 {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	u := c.base + "/allow?key=" + url.QueryEscape(key)
	if n != 1 {
		u += "&n=" + strconv.FormatInt(n, 10)
	}
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, u, nil)
	if err != nil {
		return Decision{}, fmt.Errorf("client: %w", err)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return Decision{}, ctx.Err()
		}
		return c.failed(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		if ctx.Err() != nil {
			return Decision{}, ctx.Err()
		}
		return c.failed(err)
	}
	var r allowReply
	jerr := json.Unmarshal(body, &r)
	switch {
	case resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusTooManyRequests:
		if jerr != nil {
			return c.failed(fmt.Errorf("bad reply %q: %v", truncate(body), jerr))
		}
		d, err := r.decision(resp.StatusCode)
		if err != nil {
			return c.failed(fmt.Errorf("unusable reply %q: %v", truncate(body), err))
		}
		if !d.Allowed && d.Degraded == "" {
			c.cache.put(dom, key, n, now, denial{at: now, until: now.Add(d.RetryAfter), n: n, limit: d.Limit, rate: d.Rate})
		}
		return d, nil
	case resp.StatusCode >= 400 && resp.StatusCode < 500:
		msg := r.Error
		if jerr != nil || msg == "" {
			msg = truncate(body)
		}
		return Decision{}, &RequestError{Status: resp.StatusCode, Message: msg}
	default:
		return c.failed(fmt.Errorf("status %d: %s", resp.StatusCode, truncate(body)))
	}
}

func (c *Client) failed(err error) (Decision, error) {
	return Decision{Allowed: c.fail != store.FailClosed, Source: FromFailMode}, fmt.Errorf("%w: %v", ErrUnavailable, err)
}

func truncate(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// Acquire waits until n units of work on key may proceed, across the
// network: after a denial it sleeps the service's retry-after (plus jitter,
// at least MinRetryWait, at most MaxRetryWait at a time) and asks again. A
// reply it cannot use counts as the service being unavailable, so it never
// spins on a broken server. It returns nil when allowed, including by
// store.FailOpen when the service is unavailable. It returns at once, without sleeping:
//   - ctx.Err() if ctx ends (mid-wait too);
//   - an error wrapping ErrWaitPastDeadline and context.DeadlineExceeded when
//     the next wait would end after ctx's deadline;
//   - the ErrUnavailable error under store.FailClosed;
//   - a *RequestError (n above the key's burst can never be allowed).
func (c *Client) Acquire(ctx context.Context, key string, n int64) error {
	for {
		d, err := c.Allow(ctx, key, n)
		if err != nil {
			if d.Source == FromFailMode && d.Allowed {
				return nil
			}
			return err
		}
		if d.Allowed {
			return nil
		}
		wait := min(max(d.RetryAfter, MinRetryWait), MaxRetryWait)
		if c.jitter > 0 {
			// Why capped in float: a large jitter (or +Inf) times the wait
			// is past any Duration, and converted it wrapped into a
			// negative wait that Sleep refused.
			if extra := rand.Float64() * c.jitter * float64(wait); extra < float64(MaxRetryWait) {
				wait += time.Duration(extra)
			} else { // NaN (0·Inf) lands here too
				wait += MaxRetryWait
			}
		}
		// A retry-after longer than one wait still has to pass in full.
		need := max(wait, d.RetryAfter)
		if dl, ok := ctx.Deadline(); ok {
			if now := sched.Now(ctx); now.Add(need).After(dl) {
				return fmt.Errorf("%w (need %v, %v left): %w", ErrWaitPastDeadline, need.Round(time.Millisecond),
					dl.Sub(now).Round(time.Millisecond), context.DeadlineExceeded)
			}
		}
		// Why sched.Sleep: inside a run loop it parks this fiber on the
		// loop's clock (the other fibers run meanwhile, and a virtual clock
		// jumps); outside one it is a timer on real time.
		if err := sched.Sleep(ctx, wait); err != nil {
			return err
		}
	}
}

// denyCache remembers denials until their retry-after passes. A denial of n
// tokens also answers any request of at least n on the same key (a larger
// request cannot pass sooner); a smaller one asks the service.
//
// Entries are kept per clock domain (see domainOf): a denial is an instant
// of the clock it was read on, and compared with another clock's reading
// it means nothing (a virtual clock in the year 2000 against real time is
// a retry-after of decades, either way round). An entry also answers only
// readings at or after the one it was cached at, so a clock of the same
// domain set back (a second synctest bubble) asks the service again.
type denyCache struct {
	mu sync.Mutex
	m  map[denyKey]denial // guarded by mu
}

type denyKey struct {
	dom domain
	key string
}

type denial struct {
	at    time.Time // when it was cached, on its domain's clock
	until time.Time
	n     int64
	limit int64
	rate  float64
}

// A domain names the clock a caller's "now" comes from: nil for real time,
// bubbleDomain inside a testing/synctest bubble (outside any loop), and the
// loop's clock for a fiber of a sched.Run loop (one domain per clock: loops
// sharing a vclock.Clock share it).
type domain any

type bubble struct{}

type anyLoop struct{}

var bubbleDomain, loopDomain domain = bubble{}, anyLoop{}

// domainOf returns the clock domain of ctx.
func domainOf(ctx context.Context) domain {
	if loopctx.InLoop(ctx) {
		c := loopctx.ClockOf(ctx, nil)
		// Why the check: a map key must hash, and a loop on a user's
		// clock.Clock of a type that cannot (a struct holding a slice)
		// would panic. Such loops share one domain; the cached instant
		// (denial.at) still keeps a clock set back from using it.
		if !reflect.ValueOf(c).Comparable() {
			return loopDomain
		}
		return c
	}
	if monotime.Bubbled() {
		return bubbleDomain
	}
	return nil
}

// maxDenials bounds the cache; past it, expired entries are dropped, and if
// none are, the cache is cleared (it is an optimisation, never a decision
// the service did not make).
const maxDenials = 10_000

func (dc *denyCache) get(dom domain, key string, n int64, now time.Time) (denial, bool) {
	if dc == nil {
		return denial{}, false
	}
	dc.mu.Lock()
	defer dc.mu.Unlock()
	k := denyKey{dom, key}
	d, ok := dc.m[k]
	if !ok {
		return denial{}, false
	}
	if !now.Before(d.until) || now.Before(d.at) {
		delete(dc.m, k)
		return denial{}, false
	}
	return d, n >= d.n && (d.limit <= 0 || n <= d.limit)
}

func (dc *denyCache) put(dom domain, key string, n int64, now time.Time, d denial) {
	if dc == nil {
		return
	}
	dc.mu.Lock()
	defer dc.mu.Unlock()
	if len(dc.m) >= maxDenials {
		for k, v := range dc.m {
			// Only this domain's entries can be judged by now; the clear
			// below bounds the others.
			if k.dom == dom && !now.Before(v.until) {
				delete(dc.m, k)
			}
		}
		if len(dc.m) >= maxDenials {
			clear(dc.m)
		}
	}
	k := denyKey{dom, key}
	if old, ok := dc.m[k]; ok && old.n < n && old.until.After(d.until) && !now.Before(old.at) {
		return // keep the smaller denial: it answers more requests
	}
	dc.m[k] = d
}
