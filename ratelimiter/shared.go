package ratelimiter

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/sluice-go/sluice/internal/loopctx"
	"github.com/sluice-go/sluice/internal/queue"
)

// SharedBucket is a token bucket held outside the limiter, which other
// limiters (in this process or in others) take from too. A
// *sharedbucket.Bucket is one: ratelimiter.Shared(table.Bucket(key)).
// Its methods must be safe for concurrent use.
type SharedBucket interface {
	// AllowN spends n tokens if the bucket has them now, all or nothing.
	AllowN(n int64) bool
	// RetryAfterN is how long until n tokens can be spent; a duration of
	// math.MaxInt64 means never.
	RetryAfterN(n int64) time.Duration
	// Remaining is the tokens the bucket holds now.
	Remaining() float64
	// Rate is the bucket's refill in tokens per second, and Burst its
	// size; a Burst below 1 is a bucket that grants nothing (an invalid
	// key), which Shared refuses.
	Rate() float64
	Burst() int64
}

// Shared makes the limiter take its tokens from b, which every limiter
// given the same bucket shares, in this process or, for a
// *sharedbucket.Bucket, in any process on the host that opens the same
// table: the bucket's rate and burst are the limit for all of them together.
// Within the process waiters stay FIFO; the head asks the bucket and, when
// refused, sleeps exactly the bucket's RetryAfterN on the limiter's clock
// before asking again (no busy wait).
//
// Where a Shared limiter differs from an unshared one:
//   - the rate and burst given to New are validated, then unused: Rate and
//     Burst report the bucket's;
//   - Acquire(ctx, n) with n above the bucket's burst returns an error at
//     once, where an unshared limiter collects the tokens across refills
//     (the bucket grants a cost in one step, all or nothing, so no wait
//     could satisfy it); split such a batch into calls of at most Burst();
//   - SetRate and SetBurst return an error: the bucket's policy is the
//     limit, changed only by opening the table with another policy.
//
// A sharedbucket table keeps time on the host's monotonic clock, so use
// Shared with real time (not inside a virtual-clock loop, where the retry
// sleeps would be virtual while the table's time stands still). A
// lease.Bucket reads the clock of the context its lease.Client was made
// with: give New the same context, virtual or real, and both keep one time.
func Shared(b SharedBucket) Option {
	return func(cfg *config) {
		switch {
		case b == nil:
			cfg.err = errors.New("ratelimiter: Shared(nil)")
		case b.Burst() < 1:
			cfg.err = fmt.Errorf("ratelimiter: Shared: the bucket's burst is %d: it can grant nothing (an invalid key?)", b.Burst())
		}
		cfg.shared = b
	}
}

// never is what SharedBucket.RetryAfterN returns when waiting cannot help.
const never = time.Duration(math.MaxInt64)

// minRetry is the shortest retry sleep: a table that refuses and then says
// "now" lost a race to another process, and trying again within the same
// microsecond would only race again.
const minRetry = time.Microsecond

// closedRetry is how long the head sleeps when the table says it will never
// grant (a table closed under the limiter): it keeps waiting, as for any
// limit, until its ctx ends or the limiter stops.
const closedRetry = time.Second

// shared is a Limiter's token source with Shared: the queue's free units
// are tokens this process took from the table and has not handed out (a
// grant handed back stays here: the table has no refunds). Its state is
// guarded by the queue's lock.
//
// This is the one place the limiter calls a SharedBucket.
type shared struct {
	clock  loopctx.Clock
	bucket SharedBucket
	rate   float64
	burst  int64
}

func newShared(c loopctx.Clock, b SharedBucket) *shared {
	return &shared{clock: c, bucket: b, rate: b.Rate(), burst: b.Burst()}
}

func (s *shared) Now() time.Time { return s.clock.Now() }

// Fill takes what a caller or the head is short of from the table, all or
// nothing.
func (s *shared) Fill(_ time.Time, avail, want int64, _ bool) int64 {
	if want > avail && s.bucket.AllowN(want-avail) {
		return want
	}
	return avail
}

// Due is the table's RetryAfter of the shortfall, at least minRetry; when
// the table says never, the head asks again after closedRetry.
func (s *shared) Due(now time.Time, avail, n int64) (time.Time, bool) {
	d := s.bucket.RetryAfterN(n - avail)
	if d == never {
		return now.Add(closedRetry), false
	}
	return now.Add(max(d, minRetry)), true
}

func (s *shared) Take(int64) int64                               { return 0 }
func (s *shared) Return(_, _ time.Time, avail, n, _ int64) int64 { return avail + n }

func (s *shared) check(n int) error {
	if int64(n) > s.burst {
		return fmt.Errorf("ratelimiter: Acquire(n=%d): above the shared bucket's burst %d, no wait can satisfy it", n, s.burst)
	}
	return nil
}

func (s *shared) params() (float64, int64) { return s.rate, s.burst }

func (s *shared) setRate(_ time.Time, rate float64) error {
	return fmt.Errorf("ratelimiter: SetRate(%v): the rate of a Shared limiter is its bucket's", rate)
}

func (s *shared) setBurst(_ *queue.State, burst int64) error {
	return fmt.Errorf("ratelimiter: SetBurst(%d): the burst of a Shared limiter is its bucket's", burst)
}

// tokens is this process's unspent share plus what the shared bucket holds.
func (s *shared) tokens(_ time.Time, avail int64, _ bool) float64 {
	return float64(avail) + s.bucket.Remaining()
}
