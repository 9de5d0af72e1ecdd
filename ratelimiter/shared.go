package ratelimiter

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluice-go/sluice/sharedbucket"
)

// Shared makes the limiter take its tokens from key's bucket in table, which
// every process on the host that opens the same table file shares: the
// table's policy (Limit per Window, Burst) is the limit for all of them
// together, and the rate and burst given to New are only validated. Within
// the process waiters stay FIFO; the head asks the table and, when refused,
// sleeps exactly the table's RetryAfter on the limiter's clock before asking
// again (no busy wait). Acquire of more than the table's burst fails at once.
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

// takeShared takes n tokens from this process's unspent share and the
// table, all or nothing. l.mu is held.
func (l *Limiter) takeShared(n int64) bool {
	from := min(l.prepaid, n)
	if from < n && !l.bucket.AllowN(n-from) {
		return false
	}
	l.prepaid -= from
	return true
}

// serveShared serves the queue from its head while the table grants, then
// arms the timer for the head's retry. l.mu is held.
func (l *Limiter) serveShared() {
	for wt := l.queue.Front(); wt != nil; wt = l.queue.Front() {
		if l.takeShared(wt.n) {
			l.queue.Remove(wt)
			wt.granted = true
			if !wt.w.Wake() {
				wt.granted = false
				// Cancelled first: the table has no refunds, so keep the
				// tokens for this process's next caller.
				l.prepaid += wt.n
			}
			continue
		}
		d := l.bucket.RetryAfterN(wt.n - min(l.prepaid, wt.n))
		if d == sharedbucket.Never {
			// Only a closed table (or a cost it cannot take) says never.
			l.queue.Remove(wt)
			wt.err = fmt.Errorf("ratelimiter: shared table %s refuses n=%d for good (closed?)", l.table.Path(), wt.n)
			wt.w.Wake()
			continue
		}
		now := l.now()
		l.armAt(now, now.Add(max(d, minRetry)))
		return
	}
	if l.armed {
		l.timer.Stop()
		l.armed = false
	}
}
