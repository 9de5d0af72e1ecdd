// Package decide is the step between a rate-limit request and its store that
// httplimit.Middleware and `sluice serve` share: ask the store, bounded by a
// timeout when it does I/O; tell a caller that left from a store that failed;
// answer a failed store by the fail mode; and notice, log and report when an
// outage starts and ends (once each, however many callers see it). What
// each caller counts and writes for each Outcome stays with the caller.
package decide

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/internal/monotime"
	"github.com/sluice-go/sluice/internal/selfbound"
	"github.com/sluice-go/sluice/store"
)

// Outcome is what became of one Gate.Allow.
type Outcome uint8

const (
	// Decided: the store answered; Decision.Result holds its figures.
	Decided Outcome = iota
	// Degraded: the store failed; Decision.Allowed follows the fail mode.
	// The gate has logged and reported the outage if this call began it.
	Degraded
	// Gone: the caller's context ended during the call; nobody is left to
	// answer, and the store is not to blame.
	Gone
	// Refused: the store refused the request itself
	// (store.ErrCostExceedsBurst); Decision.Err says why. It says nothing
	// about the store's health.
	Refused
)

// Change reports whether one Gate.Allow started or ended an outage (the
// gate logs it and calls Config.OnOutage then).
type Change uint8

const (
	Steady    Change = iota // no change
	Failing                 // the first failure after a decision (or the first call)
	Recovered               // the first decision after a failure
)

// Decision is the result of one Gate.Allow.
type Decision struct {
	Result  store.Result  // the store's figures when Decided; zero otherwise
	Err     error         // the store's error unless Decided
	Latency time.Duration // the store call's duration; measured only when Config.Timed
	Outcome Outcome
	Change  Change
	// Allowed is the answer to give: Result.Allowed when Decided, the fail
	// mode (Config.Fail) when Degraded, false otherwise.
	Allowed bool
}

// Config configures New.
type Config struct {
	Store store.Store
	// Timeout bounds each store call; zero or negative means no bound. A
	// store that promises a bound within Timeout (selfbound.Of: an
	// in-process store, the memory and shm stores, which never waits; the
	// Redis store, which bounds each call itself) gets none from the gate:
	// its own is tighter, and a context.WithTimeout would cost a timer per
	// request for nothing.
	Timeout time.Duration
	// Fail answers a failed store's requests: store.FailClosed denies them,
	// store.FailOpen and the zero FailMode allow them.
	Fail  store.FailMode
	Timed bool // measure Decision.Latency (two monotonic clock reads)
	// Log gets one line when an outage starts (level Error, with the
	// store's error and the fail mode) and one when it ends (level Info),
	// each message prefixed by LogPrefix; nil is slog.Default().
	Log       *slog.Logger
	LogPrefix string
	// OnOutage, when not nil, is called at the same edges: with the
	// store's error when an outage starts, with nil when it ends.
	OnOutage func(err error)
}

// Gate asks one store for decisions and follows a fail mode when it fails.
// It is safe for concurrent use; the zero value is not usable (use New).
type Gate struct {
	store    store.Store
	timeout  time.Duration
	failOpen bool
	timed    bool
	down     atomic.Bool // the last call failed: for Change only
	log      *slog.Logger
	prefix   string
	onOutage func(error)
	each     bool // the store (under a breaker) is a store.Batch: see Batches
}

// New returns a Gate over c.Store.
func New(c Config) *Gate {
	g := &Gate{store: c.Store, timeout: max(c.Timeout, 0), failOpen: c.Fail != store.FailClosed, timed: c.Timed,
		log: c.Log, prefix: c.LogPrefix, onOutage: c.OnOutage}
	if g.log == nil {
		g.log = slog.Default()
	}
	// A breaker adds no wait of its own (an open one answers at once, its
	// probes run in the background): the bound is the wrapped store's.
	var s any = c.Store
	if b, ok := s.(*store.Breaker); ok {
		s = b.Unwrap()
	}
	if b, ok := selfbound.Of(s); ok && b <= g.timeout {
		g.timeout = 0
	}
	_, g.each = s.(store.Batch)
	return g
}

// Allow asks the store whether key may spend cost tokens under p and sets *d
// to the outcome. It blocks for as long as the store call does, at most the
// timeout; when ctx ends first the Outcome is Gone.
//
// Why *d and not a returned Decision: a Decision fills every result
// register, and handing it back up cost more than the rest of the gate over
// an in-process store; written in place it costs nothing.
func (g *Gate) Allow(ctx context.Context, key string, cost int64, p store.Policy, d *Decision) {
	// Why a fast path written out here: over an in-process store (the
	// middleware's usual case) a decision costs tens of nanoseconds, and
	// one more call level measurably added to it.
	if g.timeout > 0 || g.timed {
		g.allowSlow(ctx, key, cost, p, d)
		return
	}
	res, err := g.store.Allow(ctx, key, cost, p)
	if err != nil {
		g.failed(ctx, err, 0, d)
		return
	}
	*d = Decision{Result: res, Allowed: res.Allowed}
	// Why Load before the CAS: the flag is read by every request and
	// written only at the edges of an outage; a CAS on every request would
	// take the cache line exclusive on every core.
	if g.down.Load() && g.down.CompareAndSwap(true, false) {
		g.recovered(d)
	}
}

// allowSlow is Allow with a timeout, a latency to measure, or both.
func (g *Gate) allowSlow(ctx context.Context, key string, cost int64, p store.Policy, d *Decision) {
	sctx, cancel := g.bound(ctx)
	if cancel != nil {
		defer cancel()
	}
	start := g.start()
	res, err := g.store.Allow(sctx, key, cost, p)
	lat := g.since(start)
	if err != nil {
		g.failed(ctx, err, lat, d)
		return
	}
	*d = Decision{Result: res, Latency: lat, Allowed: res.Allowed}
	g.answered(d)
}

// bound returns ctx bounded by the gate's timeout and its cancel, or ctx
// and nil when the gate sets no bound.
func (g *Gate) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if g.timeout <= 0 {
		return ctx, nil
	}
	return context.WithTimeout(ctx, g.timeout)
}

// start and since time a store call when the gate measures latency (zero
// otherwise). Why monotime and not time.Now: a latency needs only the
// monotonic clock, and time.Now also reads the wall clock, which made these
// two readings a tenth of the service's handler time over the memory store.
func (g *Gate) start() int64 {
	if !g.timed {
		return 0
	}
	return monotime.Now()
}

func (g *Gate) since(start int64) time.Duration {
	if !g.timed {
		return 0
	}
	return time.Duration(monotime.Now() - start)
}

// answered marks d, a store's answer, as the end of an outage if one was
// under way. Why the Load first: the flag is written only at the edges of
// an outage; a CAS on every answer would take the cache line exclusive.
func (g *Gate) answered(d *Decision) {
	if g.down.Load() { // small enough to inline: the rest is out of line
		g.endOutage(d)
	}
}

// endOutage marks d as the end of the outage, unless another answer just did.
func (g *Gate) endOutage(d *Decision) {
	if g.down.CompareAndSwap(true, false) {
		g.recovered(d)
	}
}

// failed sets *d for a store call that returned err.
func (g *Gate) failed(ctx context.Context, err error, lat time.Duration, d *Decision) {
	*d = Decision{Err: err, Latency: lat}
	switch {
	case ctx.Err() != nil:
		d.Outcome = Gone
	case errors.Is(err, store.ErrCostExceedsBurst):
		d.Outcome = Refused
	default:
		d.Outcome, d.Allowed = Degraded, g.failOpen
		if g.down.CompareAndSwap(false, true) {
			g.failing(d)
		}
	}
}

// failing marks d as the start of an outage, logs it and reports it: the
// one place both the middleware and the service say so.
func (g *Gate) failing(d *Decision) {
	d.Change = Failing
	mode := store.FailClosed
	if g.failOpen {
		mode = store.FailOpen
	}
	g.log.Error(g.prefix+"store failing; answering per the fail mode", "store", g.store.Name(), "err", d.Err,
		"fail", mode.String())
	if g.onOutage != nil {
		g.onOutage(d.Err)
	}
}

// recovered marks d as the end of an outage, logs it and reports it.
func (g *Gate) recovered(d *Decision) {
	d.Change = Recovered
	g.log.Info(g.prefix+"store recovered", "store", g.store.Name())
	if g.onOutage != nil {
		g.onOutage(nil)
	}
}

// DecideAll is Allow for several requests decided as one (see
// store.AllOrNothing; the store must implement it): out holds each
// request's result, and d the outcome of the whole, with d.Allowed true
// when every request was spent, or under a failed store the fail mode's
// answer for all of them. d.Result is unused.
func (g *Gate) DecideAll(ctx context.Context, reqs []store.Request, spend bool, out []store.Result, d *Decision) {
	a, ok := g.store.(store.AllOrNothing)
	if !ok {
		g.failed(ctx, fmt.Errorf("decide: store %s cannot decide several requests as one", g.store.Name()), 0, d)
		return
	}
	sctx, cancel := g.bound(ctx)
	if cancel != nil {
		defer cancel()
	}
	start := g.start()
	spent, err := a.DecideAll(sctx, reqs, spend, out)
	lat := g.since(start)
	if err != nil {
		g.failed(ctx, err, lat, d)
		return
	}
	*d = Decision{Latency: lat, Allowed: spent}
	g.answered(d)
}

// Batches reports whether DecideEach asks the store for several requests
// in one call (the store, or the one a store.Breaker wraps, is a
// store.Batch); otherwise it asks one after another, as Allow would.
func (g *Gate) Batches() bool { return g.each }

// DecideEach is Allow for several independent requests in one store call
// (store.AllowEach): d[i] is what Allow would set for reqs[i], each
// request's outcome its own (one may be Degraded and the next Decided),
// and the outage edges (Change) fall on the same requests as Allow one
// after another would put them. d[i].Latency is the whole call's. res and
// errs (each of len ≥ len(reqs)) are the store call's scratch space, the
// caller's so that it can reuse them. It blocks as Allow does, for one
// call, at most the timeout.
func (g *Gate) DecideEach(ctx context.Context, reqs []store.Request, d []Decision, res []store.Result, errs []error) {
	sctx, cancel := g.bound(ctx)
	if cancel != nil {
		defer cancel()
	}
	start := g.start()
	store.AllowEach(sctx, g.store, reqs, res, errs)
	lat := g.since(start)
	for i := range reqs {
		if err := errs[i]; err != nil {
			g.failed(ctx, err, lat, &d[i])
			continue
		}
		d[i] = Decision{Result: res[i], Latency: lat, Allowed: res[i].Allowed}
		g.answered(&d[i])
	}
}
