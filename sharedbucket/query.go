package sharedbucket

import (
	"time"

	"github.com/sluice-go/sluice/internal/gcra"
)

// debt returns how far key's TAT is ahead of now (0 for a full or unknown
// bucket) and whether the call is valid. It writes nothing.
func (t *Table) debt(key string, now int64, live bool) (int64, bool) {
	if len(key) == 0 || len(key) > MaxKeyLen || t.closed.Load() || !live && !validNow(now) {
		return 0, false
	}
	h := t.hk.hash(key)
	return t.debtOf(h, t.find(h), now, live), true
}

// debtOf reads h's debt in s (nil: unknown key, a full bucket). A slot that
// changes owner between the two reads is read as full: a figure, not a
// decision.
func (t *Table) debtOf(h uint64, s *slot, now int64, live bool) int64 {
	if s == nil {
		return 0
	}
	tat := s.tat.Load()
	if s.key.Load() != h {
		return 0
	}
	if live {
		now = t.now()
	}
	if d := gcra.Debt(tat, now); !t.damaged(d) {
		return d
	}
	return t.tau // a damaged word: the next allow repairs it to "empty"
}

// Remaining returns the tokens key could spend now, as a fraction in
// [0, burst]. It writes nothing. It returns 0 for an invalid key.
func (t *Table) Remaining(key string) float64 { return t.remainingAt(key, 0, true) }

// RemainingAt is Remaining at an explicit time (see AllowAt).
func (t *Table) RemainingAt(key string, now int64) float64 { return t.remainingAt(key, now, false) }

func (t *Table) remainingAt(key string, now int64, live bool) float64 {
	d, ok := t.debt(key, now, live)
	if !ok {
		return 0
	}
	return t.remaining(d)
}

// remaining is the figure of debt d, clamped to [0, burst]: a query's debt
// may exceed τ by up to repairSlack (a word the next spend repairs).
func (t *Table) remaining(d int64) float64 {
	r := gcra.Figures(true, d, 0, t.interval, t.tau).Remaining
	return min(max(r, 0), float64(t.burst))
}

// RetryAfter is shorthand for RetryAfterN(key, 1).
func (t *Table) RetryAfter(key string) time.Duration { return t.RetryAfterN(key, 1) }

// RetryAfterN returns how long until AllowN(key, cost) would succeed if
// nobody else spends meanwhile: 0 when it would succeed now. It returns
// Never when no wait can help: cost above the burst or below 1, an invalid
// key, or a closed table. It writes nothing.
func (t *Table) RetryAfterN(key string, cost int64) time.Duration {
	return t.retryAfterAt(key, cost, 0, true)
}

// RetryAfterAt is RetryAfterN at an explicit time (see AllowAt).
func (t *Table) RetryAfterAt(key string, cost, now int64) time.Duration {
	return t.retryAfterAt(key, cost, now, false)
}

func (t *Table) retryAfterAt(key string, cost, now int64, live bool) time.Duration {
	if cost < 1 || cost > t.burst {
		return Never
	}
	d, ok := t.debt(key, now, live)
	if !ok {
		return Never
	}
	return t.retryAfter(d, cost)
}

func (t *Table) retryAfter(d, cost int64) time.Duration {
	return gcra.Figures(false, d, cost*t.interval, t.interval, t.tau).RetryAfter
}

// ResetAfter returns how long until key's bucket is full again (0 if it is
// full or unknown): the value for a RateLimit-Reset header. It writes
// nothing. It returns 0 for an invalid key.
func (t *Table) ResetAfter(key string) time.Duration {
	d, _ := t.debt(key, 0, true)
	return time.Duration(d)
}

// ResetAfterAt is ResetAfter at an explicit time (see AllowAt).
func (t *Table) ResetAfterAt(key string, now int64) time.Duration {
	d, _ := t.debt(key, now, false)
	return time.Duration(d)
}
