package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/sluice-go/sluice/internal/loopctx"
	"github.com/sluice-go/sluice/internal/monotime"
	"github.com/sluice-go/sluice/sched"
	"github.com/sluice-go/sluice/semaphore"
	"github.com/sluice-go/sluice/store"
)

// Transport carries one Request to the server and returns its Response.
// An error means the replica cannot know whether the server handled the
// request; the Client then keeps its leases until they expire. It is called
// by one renewal at a time.
type Transport interface {
	Renew(ctx context.Context, req *Request) (*Response, error)
}

// TransportFunc is a function as a Transport.
type TransportFunc func(ctx context.Context, req *Request) (*Response, error)

// Renew calls f.
func (f TransportFunc) Renew(ctx context.Context, req *Request) (*Response, error) {
	return f(ctx, req)
}

// Defaults of Options.
const (
	DefaultRefresh = 5 * time.Second
	DefaultDrift   = 0.01
)

// Options configure a Client; the zero value is the defaults.
type Options struct {
	// Holder names this replica to the server: unique per process (two
	// processes under one name refuse each other's leases). Default: random.
	Holder string
	// Refresh is the renewal interval until the server names one
	// (Response.RefreshMS). Default 5 s.
	Refresh time.Duration
	// Drift is the largest difference in rate between this host's clock
	// and the server's, as a fraction (0.01 is 1%, the default, far beyond
	// NTP's 500 ppm): each lease is shortened by Drift times its length, so
	// that it ends here before the server re-grants it. Negative means 0.
	Drift float64
	// Fail is what a key does past its expiry without a renewal:
	// store.FailClosed (the default, also for the zero FailMode) grants
	// nothing until a renewal succeeds; store.FailOpen keeps granting at
	// the last share, and the global bound no longer holds for it.
	Fail store.FailMode
	// Clock is the time source outside a sched loop (default real time);
	// inside one the loop's clock is used.
	Clock clock.Clock
}

// Client is one replica's leases, renewed together. Make one with
// NewClient. Its methods are safe for concurrent use.
type Client struct {
	t       Transport
	clock   loopctx.Clock
	mono    bool      // the clock is real time outside a bubble: read it as base + monotime
	base    time.Time // of the clock, when mono
	mono0   int64     // monotime.Now() just before base was read
	holder  string
	drift   float64
	fail    store.FailMode
	one     *semaphore.Semaphore // one renewal at a time, parking fibers
	refresh atomic.Int64         // nanoseconds
	nextAt  atomic.Int64         // UnixNano of the next renewal due (0: none yet)

	mu      sync.Mutex
	buckets map[bkey]*Bucket
	order   []*Bucket
	closed  bool

	renewals, failures atomic.Int64
}

type bkey struct{ policy, key string }

// ErrClosed is returned by a Client's methods after Close.
var ErrClosed = errors.New("lease: client closed")

// NewClient returns a client renewing through t. ctx chooses the time
// domain only (see the package doc); the client holds no goroutine until Run.
func NewClient(ctx context.Context, t Transport, o Options) (*Client, error) {
	if t == nil {
		return nil, errors.New("lease: NewClient: nil Transport")
	}
	if o.Refresh < 0 {
		return nil, fmt.Errorf("lease: NewClient: refresh %v is negative", o.Refresh)
	}
	if o.Refresh == 0 {
		o.Refresh = DefaultRefresh
	}
	if o.Drift == 0 {
		o.Drift = DefaultDrift
	}
	if !(o.Drift < 0.5) {
		return nil, fmt.Errorf("lease: NewClient: drift %v: want a fraction below 0.5", o.Drift)
	}
	if o.Holder == "" {
		var b [12]byte
		_, _ = rand.Read(b[:])
		o.Holder = hex.EncodeToString(b[:])
	}
	c := &Client{t: t, clock: loopctx.ClockOf(ctx, o.Clock), holder: o.Holder, drift: max(o.Drift, 0),
		fail: o.Fail, one: semaphore.New(1), buckets: make(map[bkey]*Bucket)}
	if o.Clock == nil && !loopctx.InLoop(ctx) && !monotime.Bubbled() {
		// Why: a decision reads the clock once, and time.Now reads two
		// clocks (wall and monotonic) where the monotonic one alone costs
		// half as much (a decision under a lease: 13% less CPU in
		// bench's BenchmarkLease). Every reading of the client and its
		// buckets comes from here, so they share one source; mono0 is
		// read first, so these readings are never behind time.Now's (a
		// few ns ahead at most), the safe side for an expiry. Not in a
		// loop (its clock) nor a synctest bubble (time.Now is fake there).
		c.mono, c.mono0, c.base = true, monotime.Now(), time.Now()
	}
	c.refresh.Store(int64(o.Refresh))
	return c, nil
}

// now reads the client's clock.
func (c *Client) now() time.Time {
	if c.mono {
		return c.base.Add(time.Duration(monotime.Now() - c.mono0))
	}
	return c.clock.Now()
}

// Holder returns the name the client renews under.
func (c *Client) Holder() string { return c.holder }

// Stats are a client's renewal counts.
type Stats struct {
	Renewals int64 // requests sent
	Failures int64 // of which the transport failed
}

// Stats returns the client's counts.
func (c *Client) Stats() Stats { return Stats{c.renewals.Load(), c.failures.Load()} }

// failClosed reports whether a key grants nothing past its expiry: under
// store.FailClosed and under the zero FailMode, lease's default.
func (c *Client) failClosed() bool { return c.fail != store.FailOpen }

// Bucket returns the bucket of (policy, key), asking the server for a lease
// (one renewal of every key, now) the first time. It fails if the server
// cannot be reached or refuses the key; the key is then not kept.
func (c *Client) Bucket(ctx context.Context, policy, key string) (*Bucket, error) {
	k := bkey{policy, key}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	b := c.buckets[k]
	if b == nil {
		b = &Bucket{c: c, policy: policy, key: key, want: -1}
		c.buckets[k] = b
		c.order = append(c.order, b)
	}
	c.mu.Unlock()
	if b.known() {
		return b, nil
	}
	err := c.Refresh(ctx)
	if b.known() {
		return b, nil
	}
	if gerr := b.Err(); gerr != nil {
		err = gerr
	}
	if err == nil {
		err = fmt.Errorf("lease: no grant for policy %q key %q", policy, key)
	}
	c.forget(b)
	return nil, err
}

func (c *Client) forget(b *Bucket) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.buckets[bkey{b.policy, b.key}] == b {
		delete(c.buckets, bkey{b.policy, b.key})
		for i, x := range c.order {
			if x == b {
				c.order = append(c.order[:i], c.order[i+1:]...)
				break
			}
		}
	}
}

// Refresh renews every key in one request now: it reports each key's
// share and demand, applies the grants, and sends back the keys given
// back. It blocks (parks a fiber) while another renewal is in flight. A
// transport error is returned and leaves every share as it was; refusals
// of single keys are each Bucket's Err.
func (c *Client) Refresh(ctx context.Context) error {
	if err := c.one.Acquire(ctx, 1); err != nil {
		return err
	}
	defer c.one.Release(1)
	c.mu.Lock()
	bs := append([]*Bucket(nil), c.order...)
	c.mu.Unlock()
	sent := c.now()
	if len(bs) == 0 {
		c.nextAt.Store(sent.Add(time.Duration(c.refresh.Load())).UnixNano())
		return nil
	}
	req := &Request{Holder: c.holder, Keys: make([]KeyRequest, len(bs))}
	for i, b := range bs {
		req.Keys[i] = b.report(sent)
	}
	c.renewals.Add(1)
	resp, err := c.t.Renew(ctx, req)
	if err == nil && len(resp.Keys) != len(req.Keys) {
		err = fmt.Errorf("lease: the server answered %d keys of %d", len(resp.Keys), len(req.Keys))
	}
	if err != nil {
		c.failures.Add(1)
		next := sent.Add(time.Duration(c.refresh.Load())).UnixNano()
		if due := c.nextAt.Load(); due > sent.UnixNano() && due < next {
			// A renewal out of turn failed (a new key's, from Bucket):
			// the one due keeps its time. Why: moved an interval later at
			// each such failure, it never came while new keys the server
			// refuses (too many keys) were asked for more often than that,
			// and every lease held expired.
			next = due
		}
		c.nextAt.Store(next)
		return err
	}
	if resp.RefreshMS > 0 && resp.RefreshMS <= maxMS { // beyond, it would wrap negative: renewals without a pause
		c.refresh.Store(int64(time.Duration(resp.RefreshMS) * time.Millisecond))
	}
	c.nextAt.Store(sent.Add(time.Duration(c.refresh.Load())).UnixNano())
	for i, b := range bs {
		if b.apply(sent, &req.Keys[i], &resp.Keys[i]) {
			c.forget(b)
		}
	}
	return nil
}

// Run renews every refresh interval until ctx ends, and returns ctx.Err().
// Failed renewals are counted (Stats) and retried at the next interval.
// Inside a sched loop run it in a fiber (sched.Daemon); outside, in a
// goroutine.
func (c *Client) Run(ctx context.Context) error {
	for {
		// Why wait first: Bucket has just renewed; a renewal is due one
		// interval after the last one, whoever made it.
		if next := c.nextAt.Load(); next != 0 {
			if d := time.Duration(next - c.now().UnixNano()); d > 0 {
				if err := c.sleep(ctx, d); err != nil {
					return err
				}
			}
		}
		if c.nextAt.Load() > c.now().UnixNano() {
			continue // someone renewed while we slept
		}
		if err := c.Refresh(ctx); err != nil && ctx.Err() != nil {
			return ctx.Err()
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// sleep waits d on the client's clock: parking the fiber in a loop,
// blocking the goroutine outside one.
func (c *Client) sleep(ctx context.Context, d time.Duration) error {
	if loopctx.InLoop(ctx) {
		return sched.Sleep(ctx, d)
	}
	done := make(chan struct{})
	t := c.clock.AfterFunc(d, func() { close(done) })
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close gives back every lease in one request (each bucket grants nothing
// from now on) and makes later Bucket calls fail with ErrClosed. The error
// is the transport's; the server then frees the shares at their expiry.
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	c.closed = true
	bs := append([]*Bucket(nil), c.order...)
	c.mu.Unlock()
	for _, b := range bs {
		b.Release()
	}
	return c.Refresh(ctx)
}
