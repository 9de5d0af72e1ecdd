package ratelimiter

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluice-go/sluice/sched"
	"github.com/sluice-go/sluice/semaphore"
	"github.com/sluice-go/sluice/sharedbucket"
	"github.com/sluice-go/sluice/ticker"
)

// Shared makes the limiter take its tokens from key's bucket in table, which
// every process on the host that opens the same table file shares: the
// table's policy (Limit per Window, Burst) is the limit for all of them
// together, and the rate and burst given to New are only validated. Within
// the process waiters stay FIFO; the head asks the table and, when refused,
// sleeps exactly the table's RetryAfter on the limiter's clock before asking
// again (no busy wait). Acquire of more than the table's burst fails at once,
// and so do SetRate and SetBurst (the table's policy is the limit).
//
// The table keeps time on the host's monotonic clock, so use Shared with
// real time (not inside a virtual-clock loop, where the retry sleeps would be
// virtual while the table's time stands still).
func Shared(table *sharedbucket.Table, key string) Option {
	return func(cfg *config) {
		switch {
		case table == nil:
			cfg.err = errors.New("ratelimiter: Shared(nil table)")
		case key == "" || len(key) > sharedbucket.MaxKeyLen:
			cfg.err = fmt.Errorf("ratelimiter: Shared: key %q: must be 1 to %d bytes", key, sharedbucket.MaxKeyLen)
		}
		cfg.table, cfg.key = table, key
	}
}

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
// This is the one place the limiter calls sharedbucket.
type shared struct {
	clock  sched.Clock
	alarm  *ticker.Alarm
	table  *sharedbucket.Table
	bucket *sharedbucket.Bucket
	rate   float64
	burst  int64
}

func newShared(c sched.Clock, table *sharedbucket.Table, key string) *shared {
	p := table.Policy()
	return &shared{
		clock: c, table: table, bucket: table.Bucket(key),
		rate: float64(p.Limit) / p.Window.Seconds(), burst: p.Burst,
	}
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

// Demand arms the alarm for the table's RetryAfter of the head's shortfall.
func (s *shared) Demand(now time.Time, need int64) {
	if need <= 0 {
		s.alarm.Clear()
		return
	}
	d := s.bucket.RetryAfterN(need)
	if d == sharedbucket.Never {
		d = closedRetry
	}
	s.alarm.Set(now, now.Add(max(d, minRetry)))
}

func (s *shared) Until(_ time.Time, avail, n int64) time.Duration {
	if avail >= n {
		return 0
	}
	if d := s.bucket.RetryAfterN(n - avail); d != sharedbucket.Never {
		return d
	}
	return -1
}

func (s *shared) Take(int64) int64                               { return 0 }
func (s *shared) Return(_, _ time.Time, avail, n, _ int64) int64 { return avail + n }

func (s *shared) check(n int) error {
	if int64(n) > s.burst {
		return fmt.Errorf("ratelimiter: Acquire(n=%d): above the shared table's burst %d, no wait can satisfy it", n, s.burst)
	}
	return nil
}

func (s *shared) params() (float64, int64) { return s.rate, s.burst }

func (s *shared) setRate(_ time.Time, rate float64) error {
	return fmt.Errorf("ratelimiter: SetRate(%v): the rate of a Shared limiter is the table's policy (%s)", rate, s.table.Path())
}

func (s *shared) setBurst(_ *semaphore.State, burst int64) error {
	return fmt.Errorf("ratelimiter: SetBurst(%d): the burst of a Shared limiter is the table's policy (%s)", burst, s.table.Path())
}

// tokens is this process's unspent share plus what the table's bucket holds.
func (s *shared) tokens(_ time.Time, avail int64, _ bool) float64 {
	return float64(avail) + s.bucket.Remaining()
}
