// Package ratelimiter is a blocking token bucket: an app-wide speed limit for
// anything that talks to a rate-limited service. Acquire parks the caller
// until its tokens are free, in strict FIFO order, honours context timeouts
// and cancellation, and never loses a token.
//
// The context carries the time domain. Inside a sched.Run loop, Acquire parks
// the calling fiber and the limiter runs on the loop's clock, so under a
// virtual clock (sched.Virtual) an hour of limiter behaviour runs in a
// fraction of a second of real time, with exact, repeatable timestamps.
// Outside any loop it blocks the calling goroutine on real time, or on the
// clock given with WithClock (a *clock.Mock for tests that drive time by
// hand).
//
// With the Shared option the tokens come from a sharedbucket.Table, so one
// limit holds across every process on the host.
package ratelimiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/sluice-go/sluice/internal/waitq"
	"github.com/sluice-go/sluice/sched"
	"github.com/sluice-go/sluice/sharedbucket"
)

// ErrStopped is returned by Acquire once the limiter is stopped, by Stop or
// by the end of the context given to New, including to every Acquire that
// was parked at that moment.
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
// Burst (a full bucket gains nothing). Over any window of time, calls of at
// most Burst tokens are granted at most Rate·window + Burst tokens in total,
// and a saturated limiter delivers exactly Rate in the long run: the k-th
// token after the bucket ran dry comes at exactly k/Rate seconds. (A call of
// n > Burst collects its tokens over time and is granted them all at once,
// so a window that ends at its grant can see up to n − Burst more.)
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
	rate      float64 // tokens per second
	nanoRate  uint64  // rate·1e9, rounded: the refill's exact arithmetic
	burst     int64
	clock     sched.Clock
	table     *sharedbucket.Table
	bucket    *sharedbucket.Bucket // non-nil with Shared
	stopWatch func() bool          // unregisters the stop on New's ctx

	mu       sync.Mutex                   // guards the fields below
	tokens   int64                        // whole tokens in the bucket; 0 whenever anyone waits
	base     time.Time                    // accrual origin: tokens accrue from here
	credited int64                        // whole tokens credited since base
	prepaid  int64                        // Shared: tokens taken from the table, not yet handed out
	queue    waitq.Queue[waiter, *waiter] // FIFO of parked callers
	stopped  bool
	timer    sched.Timer // created on first need, then Reset
	armed    bool        // timer is armed for timerAt
	timerAt  time.Time
}

// A waiter is one parked Acquire. Waiters are pooled (the sched.Waiter inside
// is reusable once Wait returns, and OnCancel is bound once per node), so a
// parked Acquire allocates nothing in steady state.
type waiter struct {
	waitq.Links[waiter] // in the queue; guarded by the owner's mu
	w                   sched.Waiter
	l                   *Limiter
	n                   int64
	got                 int64 // tokens collected so far, as the head of the queue
	err                 error // set by Stop or a refusing table before Wake
	granted             bool  // woken holding its n tokens; guarded by l.mu
}

var waiterPool = sync.Pool{New: func() any {
	wt := &waiter{}
	wt.w.Reason = "ratelimiter.Acquire"
	wt.w.OnCancel = wt.cancel
	return wt
}}

// An Option configures New.
type Option func(*config)

type config struct {
	clock clock.Clock
	table *sharedbucket.Table
	key   string
	err   error
}

// WithClock sets the time source used outside any loop (the default is real
// time). A *clock.Mock lets a test drive the limiter by hand: refills happen
// as mock.Add moves time (the mock runs timer callbacks on goroutines of its
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

// New returns a limiter of rate tokens per second (fractional rates are
// fine: 0.5 is one token every two seconds) and a bucket of burst tokens,
// full. ctx sets the time domain: the loop's clock inside a sched.Run loop,
// else the WithClock clock or real time. When ctx ends the limiter stops, as
// by Stop; a limiter made in a loop therefore stops when its run ends.
//
// rate must be a finite number of tokens per second in [1e-9, 1e9] (it is
// kept to a billionth of a token per second) and burst at least 1;
// otherwise New returns an error naming the bad value.
func New(ctx context.Context, rate float64, burst int, opts ...Option) (*Limiter, error) {
	if math.IsNaN(rate) || math.IsInf(rate, 0) || rate <= 0 {
		return nil, fmt.Errorf("ratelimiter: rate %v: must be a finite number of tokens per second above 0", rate)
	}
	if rate < minRate || rate > maxRate {
		return nil, fmt.Errorf("ratelimiter: rate %v: must be between %v and %v tokens per second", rate, minRate, maxRate)
	}
	if burst < 1 {
		return nil, fmt.Errorf("ratelimiter: burst %d: must be at least 1", burst)
	}
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.err != nil {
		return nil, cfg.err
	}
	l := &Limiter{
		rate:     rate,
		nanoRate: uint64(math.Round(rate * 1e9)),
		burst:    int64(burst),
		clock:    sched.ClockOf(ctx, cfg.clock),
		tokens:   int64(burst),
	}
	if cfg.table != nil {
		p := cfg.table.Policy()
		l.table, l.bucket = cfg.table, cfg.table.Bucket(cfg.key)
		l.rate = float64(p.Limit) / p.Window.Seconds()
		l.burst, l.tokens = p.Burst, 0
	}
	l.base = l.now()
	stop := func() { l.stop(false) }
	if a, ok := ctx.(afterFuncer); ok {
		// A loop's context: the stop runs on the goroutine that ends it,
		// before Run returns, not on a goroutine of its own; and a run's
		// root ends with the run even when its Done is nil.
		l.stopWatch = a.AfterFunc(stop)
	} else if ctx.Done() != nil {
		l.stopWatch = context.AfterFunc(ctx, stop)
	}
	return l, nil
}

// afterFuncer is implemented by sched's loop contexts (and is what
// context.AfterFunc looks for): AfterFunc runs f on the cancelling goroutine.
type afterFuncer interface {
	AfterFunc(f func()) (stop func() bool)
}

// now reads the limiter's clock.
func (l *Limiter) now() time.Time { return l.clock.Now() }

// Acquire takes n tokens, parking the caller (a fiber inside a loop, else
// the goroutine) until they are free and every earlier Acquire has been
// served. The head of the queue collects tokens as they are credited until it
// holds n, so n may exceed Burst: a batch of 50 on a burst of 10 spends the
// 10 at once and waits for 40 more.
//
// It returns nil holding all n, or an error holding none:
//   - ctx.Err() when ctx ends first (a ctx already done fails at once, even
//     with tokens in the bucket); every token the call had collected goes
//     back, to the next waiter first, then to the bucket (which never holds
//     more than Burst);
//   - ErrStopped once the limiter is stopped;
//   - an error naming n when n < 1 (or, with Shared, n above the table's
//     burst, which no wait could satisfy).
func (l *Limiter) Acquire(ctx context.Context, n int) error {
	if n < 1 {
		return fmt.Errorf("ratelimiter: Acquire(n=%d): n must be at least 1", n)
	}
	if l.bucket != nil && int64(n) > l.burst {
		return fmt.Errorf("ratelimiter: Acquire(n=%d): above the shared table's burst %d, no wait can satisfy it", n, l.burst)
	}
	// A done context wins even when tokens are free, so that whether a
	// cancelled caller gets a token never depends on timing.
	if err := ctx.Err(); err != nil {
		return err
	}
	n64 := int64(n)
	l.mu.Lock()
	if ok, err := l.tryLocked(n64); ok || err != nil {
		l.mu.Unlock()
		return err
	}
	l.mu.Unlock()

	// Slow path: bind a pooled waiter to the caller before publishing it,
	// then look again, since tokens may have come meanwhile.
	wt := waiterPool.Get().(*waiter)
	wt.l, wt.n, wt.got, wt.err, wt.granted = l, n64, 0, nil, false
	wt.w.N = n64
	wt.w.Prepare(ctx)
	l.mu.Lock()
	if ok, err := l.tryLocked(n64); ok || err != nil {
		l.mu.Unlock()
		wt.l = nil
		waiterPool.Put(wt)
		return err
	}
	l.queue.Push(wt)
	if l.bucket != nil {
		l.serveShared()
	} else {
		if wt == l.queue.Front() {
			// The new head takes what the bucket has (less than n, or
			// tryLocked would have succeeded) and waits for the rest.
			wt.got, l.tokens = l.tokens, 0
		}
		l.arm(l.now())
	}
	l.mu.Unlock()

	err := l.wait(ctx, wt)
	if err == nil {
		err = wt.err // nil for a grant; ErrStopped or a table's refusal
	}
	wt.l, wt.err = nil, nil
	waiterPool.Put(wt)
	return err
}

// tryLocked takes n tokens if nobody waits and they are there. It returns an
// error when Acquire must fail at once. l.mu is held.
func (l *Limiter) tryLocked(n int64) (bool, error) {
	if l.stopped {
		return false, ErrStopped
	}
	if l.queue.Front() != nil {
		return false, nil
	}
	if l.bucket != nil {
		return l.takeShared(n), nil
	}
	l.credit(l.now())
	if l.tokens >= n {
		l.tokens -= n
		return true, nil
	}
	return false, nil
}

// TryAcquire takes n tokens if they are in the bucket now and nobody is
// waiting (no barging past parked Acquire calls), and reports whether it
// did. It never blocks; it returns false for n < 1 and once stopped. Its cost
// is one uncontended lock and one clock read.
func (l *Limiter) TryAcquire(n int) bool {
	if n < 1 {
		return false
	}
	l.mu.Lock()
	ok, _ := l.tryLocked(int64(n))
	l.mu.Unlock()
	return ok
}

// Stop stops the limiter: refills halt, every parked Acquire returns
// ErrStopped, and later calls to Acquire return ErrStopped at once
// (TryAcquire returns false). It reports true the first time only.
func (l *Limiter) Stop() bool { return l.stop(true) }

func (l *Limiter) stop(unwatch bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return false
	}
	l.stopped = true
	if unwatch && l.stopWatch != nil {
		l.stopWatch()
	}
	if l.timer != nil {
		l.timer.Stop()
		l.armed = false
	}
	for wt := l.queue.Front(); wt != nil; wt = l.queue.Front() {
		l.queue.Remove(wt)
		wt.got = 0 // nothing is handed out any more
		wt.err = ErrStopped
		wt.w.Wake() // false: cancelled meanwhile, it returns ctx.Err()
	}
	return true
}

// Tokens returns the tokens in the bucket now, with the fraction of the next
// one accrued so far: a number in [0, Burst]. Tokens collected by a waiting
// Acquire are not in the bucket. With Shared it is this process's unspent
// share plus what the table's bucket holds.
func (l *Limiter) Tokens() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bucket != nil {
		return float64(l.prepaid) + l.bucket.Remaining()
	}
	now := l.now()
	if l.stopped {
		return float64(l.tokens)
	}
	l.credit(now)
	t := float64(l.tokens)
	if l.queue.Len() == 0 && l.tokens < l.burst {
		// credit has handed out every whole token, so what accrued beyond
		// them is the fraction of the next one.
		_, frac := l.accrued(now.Sub(l.base))
		t += float64(frac) / nanoScale
	}
	return min(t, float64(l.burst))
}

// Waiters returns the number of parked Acquire calls.
func (l *Limiter) Waiters() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.queue.Len()
}

// Running reports whether the limiter still refills (Stop not called, New's
// ctx not ended).
func (l *Limiter) Running() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.stopped
}

// Rate returns the refill rate in tokens per second (with Shared, the
// table's: Limit per Window).
func (l *Limiter) Rate() float64 { return l.rate }

// Burst returns the bucket's size (with Shared, the table's burst).
func (l *Limiter) Burst() int { return int(l.burst) }

// String describes the limiter's configuration.
func (l *Limiter) String() string {
	return fmt.Sprintf("ratelimiter.Limiter{rate: %v/s, burst: %d}", l.rate, l.burst)
}
