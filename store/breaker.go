package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// ErrDown is wrapped by the errors a Breaker returns while it is open: the
// store failed and is not asked again until a probe gets through. The error
// also wraps the store's last failure.
var ErrDown = errors.New("store down")

// Breaker defaults.
const (
	DefaultTrip         = 3
	DefaultProbeEvery   = 200 * time.Millisecond
	DefaultProbeTimeout = 250 * time.Millisecond
)

// BreakerOptions configure NewBreaker. Zero fields take the defaults.
type BreakerOptions struct {
	// Trip is how many failures in a row open the breaker (DefaultTrip).
	Trip int
	// ProbeEvery is how often an open breaker pings the store
	// (DefaultProbeEvery).
	ProbeEvery time.Duration
	// ProbeTimeout bounds one probe (DefaultProbeTimeout).
	ProbeTimeout time.Duration
	// Logger gets one line when the breaker opens and one when it closes
	// (nil: no logs).
	Logger *slog.Logger
}

// Breaker is a Store that stops calling a failing store. After Trip calls
// in a row fail (Allow or Ping, not counting calls whose caller cancelled
// them), it opens: Allow, Ping and Keys then return an error wrapping
// ErrDown and the store's last error at once, so a store outage costs
// callers microseconds, not a timeout each. While open, a background
// goroutine pings the store every ProbeEvery; the first ping that succeeds
// closes the breaker, so decisions resume within one probe of the store's
// return.
//
// A Breaker is safe for concurrent use. It owns the store: Close stops the
// probe and closes the store. Wrap stores that wait on the network (Redis);
// in-process stores cannot fail this way.
type Breaker struct {
	s   Store
	opt BreakerOptions

	fails atomic.Int32             // consecutive failures while closed
	open  atomic.Pointer[downInfo] // nil while closed

	mu     sync.Mutex    // guards the probe's lifecycle
	closed bool          // guarded by mu
	stop   chan struct{} // guarded by mu: closed by Close
	probes sync.WaitGroup
}

type downInfo struct {
	err   error // what Allow returns: ErrDown and the cause
	since time.Time
}

// NewBreaker wraps s.
func NewBreaker(s Store, opt BreakerOptions) *Breaker {
	if opt.Trip <= 0 {
		opt.Trip = DefaultTrip
	}
	if opt.ProbeEvery <= 0 {
		opt.ProbeEvery = DefaultProbeEvery
	}
	if opt.ProbeTimeout <= 0 {
		opt.ProbeTimeout = DefaultProbeTimeout
	}
	return &Breaker{s: s, opt: opt, stop: make(chan struct{})}
}

// Unwrap returns the wrapped store.
func (b *Breaker) Unwrap() Store { return b.s }

// Fault returns nil while the breaker is closed, else the error that
// Allow returns (ErrDown and the store's last failure).
func (b *Breaker) Fault() error {
	if d := b.open.Load(); d != nil {
		return d.err
	}
	return nil
}

// Allow implements Store.
func (b *Breaker) Allow(ctx context.Context, key string, cost int64, p Policy) (Result, error) {
	if d := b.open.Load(); d != nil {
		return Result{}, d.err
	}
	r, err := b.s.Allow(ctx, key, cost, p)
	b.record(ctx, err)
	return r, err
}

// Ping implements Store. While open it returns the fault without asking
// the store (the probe does that).
func (b *Breaker) Ping(ctx context.Context) error {
	if d := b.open.Load(); d != nil {
		return d.err
	}
	err := b.s.Ping(ctx)
	b.record(ctx, err)
	return err
}

// Keys implements Store; it neither counts towards nor waits on an open
// breaker.
func (b *Breaker) Keys(ctx context.Context) (int64, error) {
	if d := b.open.Load(); d != nil {
		return 0, d.err
	}
	return b.s.Keys(ctx)
}

// Name implements Store: the wrapped store's name.
func (b *Breaker) Name() string { return b.s.Name() }

// Close stops the probe and closes the store.
func (b *Breaker) Close() error {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		close(b.stop)
	}
	b.mu.Unlock()
	b.probes.Wait()
	return b.s.Close()
}

// record counts a call's outcome. Why some errors do not count: a caller
// that cancelled says nothing about the store, and ErrCostExceedsBurst is
// the request's fault. A deadline does count: the service's per-call
// timeout expiring means the store is too slow.
func (b *Breaker) record(ctx context.Context, err error) {
	switch {
	case err == nil:
		if b.fails.Load() != 0 { // no write on the hot path while healthy
			b.fails.Store(0)
		}
		return
	case errors.Is(err, ErrCostExceedsBurst), errors.Is(err, ErrClosed),
		errors.Is(ctx.Err(), context.Canceled):
		return
	}
	if int(b.fails.Add(1)) >= b.opt.Trip {
		b.trip(err)
	}
}

func (b *Breaker) trip(cause error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.open.Load() != nil {
		return
	}
	b.open.Store(&downInfo{err: b.downErr(cause), since: time.Now()})
	if b.opt.Logger != nil {
		b.opt.Logger.Error("store down: answering without it; probing", "store", b.s.Name(),
			"err", cause, "probe_every", b.opt.ProbeEvery.String())
	}
	b.probes.Add(1)
	go b.probe()
}

func (b *Breaker) downErr(cause error) error {
	return fmt.Errorf("%w (%s): %w", ErrDown, b.s.Name(), cause)
}

// probe pings the store every ProbeEvery until a ping succeeds (closing the
// breaker) or Close.
func (b *Breaker) probe() {
	defer b.probes.Done()
	t := time.NewTicker(b.opt.ProbeEvery)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), b.opt.ProbeTimeout)
		err := b.s.Ping(ctx)
		cancel()
		d := b.open.Load()
		if err != nil {
			// Report the latest cause (a refused dial may become a timeout).
			b.open.Store(&downInfo{err: b.downErr(err), since: d.since})
			continue
		}
		b.fails.Store(0)
		b.open.Store(nil)
		if b.opt.Logger != nil {
			b.opt.Logger.Info("store back: breaker closed", "store", b.s.Name(),
				"down_for", time.Since(d.since).Round(time.Millisecond).String())
		}
		return
	}
}
