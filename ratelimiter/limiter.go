// Package ratelimiter is a blocking token bucket: an app-wide speed limit for
// anything that talks to a rate-limited service.
//
//	limiter, err := ratelimiter.New(ctx, 5, 10) // 5 per second, bursts of 10
//	if err != nil { ... }
//	defer limiter.Stop()
//	for _, url := range urls {
//		if err := limiter.Acquire(ctx, 1); err != nil {
//			return err // ctx ended (holding nothing), or the limiter was stopped
//		}
//		resp, err := http.Get(url)
//		...
//	}
//
// The contract: Acquire waits in strict FIFO order and is what blocks. A ctx
// that is done before Acquire returns always wins: Acquire returns ctx.Err()
// holding nothing, and the tokens it had collected go on to the next waiter
// or back to the bucket, as far as a bucket of Burst holds them; a wait that
// cannot end before ctx's deadline fails at once. Over any window [s, e] the
// tokens granted to callers of n ≤ Burst are at most Burst + Rate·(e−s),
// through cancels, SetRate, SetBurst and Stop. TryAcquire takes tokens only
// if they are there now and never passes a parked Acquire. Stop releases
// every waiter with ErrStopped. Shared takes the tokens from a bucket other
// processes share (a sharedbucket.Bucket). A Limiter is built on the same
// FIFO parking core as semaphore.Semaphore and ticker.Ticker, and arms its
// refill timer only while someone waits.
//
// Time comes from the ctx given to New, as in every package here that
// waits: a sched.Run loop's clock (virtual or real; Acquire parks the
// fiber), a testing/synctest bubble's fake time with no option at all, and
// real time otherwise, or the clock.Clock given with WithClock (a
// *clock.Mock for tests that move time by hand).
package ratelimiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/sluice-go/sluice/internal/loopctx"
	"github.com/sluice-go/sluice/internal/monotime"
	"github.com/sluice-go/sluice/internal/queue"
)

// ErrStopped is returned by Acquire once the limiter is stopped, by Stop or
// by the end of the run it was made in, including to every Acquire that was
// parked at that moment.
var ErrStopped = errors.New("ratelimiter: limiter stopped")

// Bounds on the rate: the refill works in whole nanotokens per second.
const (
	minRate = 1e-9 // one token in about 32 years
	maxRate = 1e9  // one token per nanosecond
)

// neverDelay is the timer delay used when the next token is further away than
// any timer can express: about 146 years.
const neverDelay = time.Duration(math.MaxInt64 / 2)

// A Limiter is a token bucket of Burst tokens refilled at Rate tokens per
// second, starting full. Acquire takes tokens, waiting in FIFO order while
// the bucket cannot cover them; TryAcquire takes them only if it can at once.
//
// Refills are credited from the clock: every whole token accrued since the
// last credit, carrying the fraction, and only while the bucket is below
// Burst (a full bucket gains nothing). A saturated limiter delivers exactly
// Rate in the long run: the k-th token after the bucket ran dry comes at
// exactly k/Rate seconds.
//
// The bound (of the limiter's own bucket; with Shared, the shared bucket's holds
// for what this process takes from it): over any window [s, e], calls of
// n ≤ Burst are granted at most Burst + Rate·(e−s) tokens in total, through
// cancels, timeouts, SetRate (each rate counts for the part of the window
// it was in force), SetBurst (the largest burst in force in the window
// counts) and Stop. A call of n > Burst collects its tokens over time and
// is granted them all at once, so a window that ends at its grant can see
// up to n − Burst more. The instants are those of the limiter's clock: on
// real time a refill timer that fires late hands out what accrued
// meanwhile at once, as x/time/rate's Wait returns late.
//
// Tokens that come back are capped: a waiter that leaves without its
// tokens (its ctx ended, or the limiter stopped), or hands back a grant
// because its ctx ended before Acquire returned, puts what it held back in
// the bucket only as far as the bucket holds it, Burst counting the
// accrued fraction of the next token, and the rest is dropped, as
// x/time/rate caps what a cancelled reservation restores. (A head of
// n > Burst may hold up to n − 1 tokens; a grant handed back after time
// has passed is worth less by what the bucket accrued meanwhile.) Handing
// all of it to the waiters behind would grant them that many in one
// instant. Nothing else is lost: every token a leaver held is granted
// later, stays in the bucket, or goes to that cap.
//
// A timer (on the limiter's clock) is armed only while someone waits: an idle
// limiter, or one whose bucket is full, arms nothing, holds no goroutine and
// keeps no sched.Run open. Stop is therefore never needed to let a run or a
// program end; it exists to fail the waiters of a limiter being retired.
//
// The limiter keeps the clock it was made with: make it inside the loop whose
// fibers use it. A limiter made outside a virtual-time loop refills on real
// time (or its mock), which that loop cannot see: fibers parked on it with
// nothing else pending are reported in a sched.DeadlockError.
//
// A Limiter is safe for use by many goroutines and fibers at once. The zero
// value is not usable: call New.
type Limiter struct {
	q         *queue.Queue // free units: the tokens in the bucket (uncapped while someone waits)
	src       tokenSource  // the Queue's Source; its state is guarded by the Queue's lock
	b         *bucket      // src when it is a bucket (its fast path), else nil
	stopWatch func() bool  // unregisters the stop at the end of the run
}

// A tokenSource feeds a Limiter's queue: a bucket refilled from the clock,
// or a shared bucket. What differs between them is here, not in branches
// through the Limiter. Every method runs under the queue's lock.
type tokenSource interface {
	queue.Source
	check(n int) error // a request no wait can satisfy
	params() (rate float64, burst int64)
	setRate(now time.Time, rate float64) error
	setBurst(s *queue.State, burst int64) error
	tokens(now time.Time, avail int64, waiting bool) float64
}

// An Option configures New.
type Option func(*config)

type config struct {
	clock  clock.Clock
	shared SharedBucket
	err    error
}

// WithClock sets the time source used outside any loop (the default is real
// time, which inside a testing/synctest bubble is the bubble's fake time). A
// *clock.Mock lets a test drive the limiter by hand: refills happen as
// mock.Add moves time (the mock runs timer callbacks on goroutines of its
// own, so wait for their effect, for example for Acquire to return). Inside
// a sched.Run loop the loop's clock is used instead.
func WithClock(c clock.Clock) Option {
	return func(cfg *config) {
		if c == nil {
			cfg.err = errors.New("ratelimiter: WithClock(nil)")
		}
		cfg.clock = c
	}
}

// checkRate returns an error naming a rate New and SetRate refuse.
func checkRate(rate float64) error {
	if math.IsNaN(rate) || math.IsInf(rate, 0) || rate <= 0 {
		return fmt.Errorf("ratelimiter: rate %v: must be a finite number of tokens per second above 0", rate)
	}
	if rate < minRate || rate > maxRate {
		return fmt.Errorf("ratelimiter: rate %v: must be between %v and %v tokens per second", rate, minRate, maxRate)
	}
	return nil
}

func checkBurst(burst int) error {
	if burst < 1 {
		return fmt.Errorf("ratelimiter: burst %d: must be at least 1", burst)
	}
	return nil
}

// New returns a limiter of rate tokens per second (fractional rates are
// fine: 0.5 is one token every two seconds) and a bucket of burst tokens,
// full.
//
// ctx chooses the time domain only, never the limiter's lifetime (a ctx is
// request-scoped): when ctx belongs to a sched.Run loop, through any
// wrapper, the limiter runs on the loop's clock and stops when that run
// ends; otherwise it runs on the WithClock clock or real time, and only Stop
// stops it. Passing a request's ctx is therefore harmless.
//
// rate must be a finite number of tokens per second in [1e-9, 1e9] (it is
// kept to a billionth of a token per second) and burst at least 1;
// otherwise New returns an error naming the bad value.
func New(ctx context.Context, rate float64, burst int, opts ...Option) (*Limiter, error) {
	if err := checkRate(rate); err != nil {
		return nil, err
	}
	if err := checkBurst(burst); err != nil {
		return nil, err
	}
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.err != nil {
		return nil, cfg.err
	}
	c := loopctx.ClockOf(ctx, cfg.clock)
	l := &Limiter{}
	var full int64 // the queue's free tokens: none of a shared bucket's are this process's yet
	if cfg.shared != nil {
		l.src = newShared(c, cfg.shared)
	} else {
		b := &bucket{clock: c, rate: rate, nanoRate: uint64(math.Round(rate * 1e9)), burst: int64(burst)}
		// Real time outside any synctest bubble (no loop, no WithClock):
		// read the monotonic clock alone, from an origin read just before
		// the epoch (see Now).
		if cfg.clock == nil && !loopctx.InLoop(ctx) && !monotime.Bubbled() {
			b.mono, b.origin = true, monotime.Now()
		}
		b.base = c.Now()
		b.epoch = b.base
		l.src, l.b = b, b
		b.fast.Store(newFastWord(b.nanoRate, b.burst)) // the queue settles the full bucket into it
		full = int64(burst)
	}
	l.q = queue.New(queue.Config{Reason: "ratelimiter.Acquire", Avail: full, Source: l.src, Clock: c, FailEarly: true})
	l.stopWatch = loopctx.AfterRun(ctx, func() { l.q.Close(ErrStopped) })
	return l, nil
}

// Acquire takes n tokens, blocking the caller (parking the fiber inside a
// loop, else the goroutine) until they are free and every earlier Acquire
// has been served. The head of the queue collects tokens as they are
// credited until it holds n, so n may exceed Burst: a batch of 50 on a
// burst of 10 spends the 10 at once and waits for 40 more.
//
// It returns nil holding all n, or an error holding none:
//   - ctx.Err() when ctx is done before Acquire returns (a ctx already done
//     fails at once, even with tokens in the bucket); the tokens the call
//     had collected go back to the bucket as far as it holds them, and
//     from there to the next waiter (the rest is dropped: see Limiter);
//   - at once, an error matching context.DeadlineExceeded when the tokens
//     cannot be there before ctx's deadline even if every waiter ahead gave
//     up (n minus the tokens there now, at the rate), as x/time/rate's Wait;
//   - ErrStopped once the limiter is stopped;
//   - an error naming n when n < 0 (or, with Shared, n above the shared bucket's
//     burst, which no wait could satisfy).
//
// Acquire(ctx, 0) returns at once: ctx.Err(), or nil.
func (l *Limiter) Acquire(ctx context.Context, n int) error {
	// Tokens there and nobody waiting: the fast word decides (it is never
	// the state while anyone waits, so nobody is passed), or else the
	// queue's TryAcquire (the same test, under the same lock, as Acquire's
	// own first step), without the parking path's larger call.
	if n > 0 && ctx.Err() == nil {
		ok, decided := false, false
		if l.b != nil {
			ok, decided = l.b.tryFast(int64(n))
		}
		if !decided {
			_, ok = l.q.TryAcquire(int64(n))
		}
		if ok {
			return nil
		}
	}
	if n <= 0 {
		if n < 0 {
			return fmt.Errorf("ratelimiter: Acquire(n=%d): n must not be negative", n)
		}
		return ctx.Err()
	}
	if err := l.src.check(n); err != nil {
		return err
	}
	_, err := l.q.Acquire(ctx, int64(n))
	return err
}

// TryAcquire takes n tokens if they are in the bucket now and nobody is
// waiting (no barging past parked Acquire calls), and reports whether it
// did. It never blocks; it returns false for n < 1 and once stopped. While
// nobody waits, at a rate whose token interval is a whole number of
// nanoseconds or of 1/k ns for k up to 64 (1/s, 3/s, 10/s, 60/s, 1000/s,
// 0.5/s; not 7.3/s), its cost is one clock read (on real time, of the
// monotonic clock alone) and one compare-and-swap; otherwise one uncontended
// lock besides. The answers are the same either way, to the nanosecond.
func (l *Limiter) TryAcquire(n int) bool {
	if n < 1 {
		return false
	}
	if l.b != nil {
		if ok, decided := l.b.tryFast(int64(n)); decided {
			return ok
		}
	}
	_, ok := l.q.TryAcquire(int64(n))
	return ok
}

// SetRate changes the refill rate of a live limiter, from now on: tokens
// accrued so far (and the fraction of the next) are kept, and parked
// Acquire calls are re-timed at once for the new rate. This is how a client
// backs off when the upstream answers 429. A rate New would refuse is an
// error naming it, and so is any SetRate with Shared (the shared bucket's is
// the rate).
func (l *Limiter) SetRate(rate float64) error {
	if err := checkRate(rate); err != nil {
		return err
	}
	var err error
	l.q.Do(func(s *queue.State) { err = l.src.setRate(s.Now, rate) })
	return err
}

// SetBurst changes the bucket's size of a live limiter: a bucket holding
// more than the new burst keeps only burst, and parked Acquire calls are
// re-timed at once. A burst below 1 is an error naming it, and so is any
// SetBurst with Shared (the shared bucket's is the burst).
func (l *Limiter) SetBurst(burst int) error {
	if err := checkBurst(burst); err != nil {
		return err
	}
	var err error
	l.q.Do(func(s *queue.State) { err = l.src.setBurst(s, int64(burst)) })
	return err
}

// Stop stops the limiter: refills halt, every parked Acquire returns
// ErrStopped, and later calls to Acquire return ErrStopped at once
// (TryAcquire returns false). It reports true the first time only.
func (l *Limiter) Stop() bool {
	if l.stopWatch != nil {
		l.stopWatch()
	}
	return l.q.Close(ErrStopped)
}

// Tokens returns the tokens in the bucket now, with the fraction of the next
// one accrued so far: a number in [0, Burst]. Tokens collected by a waiting
// Acquire are not in the bucket. With Shared it is this process's unspent
// share plus what the shared bucket holds.
func (l *Limiter) Tokens() float64 {
	var t float64
	l.q.Do(func(s *queue.State) { t = l.src.tokens(s.Now, s.Avail, s.Waiting) })
	return t
}

// Waiters returns the number of parked Acquire calls.
func (l *Limiter) Waiters() int { return l.q.Waiters() }

// Running reports whether the limiter still refills: neither Stop nor the
// end of the run it was made in has stopped it.
func (l *Limiter) Running() bool { return l.q.Closed() == nil }

// Rate returns the refill rate in tokens per second (with Shared, the
// shared bucket's).
func (l *Limiter) Rate() float64 {
	r, _ := l.params()
	return r
}

// Burst returns the bucket's size (with Shared, the shared bucket's).
func (l *Limiter) Burst() int {
	_, b := l.params()
	return int(b)
}

// dropped returns the tokens the bucket could not hold and dropped (see
// Limiter): 0 with Shared.
func (l *Limiter) dropped() float64 {
	var d float64
	l.q.Do(func(*queue.State) {
		if l.b != nil {
			d = l.b.dropped.tokens()
		}
	})
	return d
}

func (l *Limiter) params() (rate float64, burst int64) {
	l.q.Do(func(*queue.State) { rate, burst = l.src.params() })
	return rate, burst
}

// String describes the limiter's configuration.
func (l *Limiter) String() string {
	r, b := l.params()
	return fmt.Sprintf("ratelimiter.Limiter{rate: %v/s, burst: %d}", r, b)
}
