package ratelimiter

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// The fast path: a take from a bucket that has the tokens, with nobody
// waiting, decided by one load and one compare-and-swap on a single word,
// without the queue's lock and without a time.Time.
//
// Why it is exact: when a token's interval T = 1e18/nanoRate ns is a whole
// number of nanoseconds, token k after base is due at exactly base + k·T,
// so the bucket's state (base, credited, and the queue's avail) is told
// entirely by the instant the bucket is full again,
//
//	TAT = base + (credited + burst − avail)·T,
//
// and every decision of the locked model is a decision on TAT alone (the
// generic cell rate algorithm): a take of n at now is granted iff
// max(TAT, now) + n·T − now ≤ burst·T, and makes TAT max(TAT, now) + n·T.
// (From a full bucket, TAT ≤ now: the locked model restarts base at now
// and keeps burst − n, TAT' = now + n·T; otherwise it credits
// floor((now − base)/T) and keeps avail' − n, TAT' = TAT + n·T; and
// avail' ≥ n is now − base ≥ (credited + n − avail)·T, that is
// TAT + n·T − now ≤ burst·T.) Tokens and the fraction of the next one
// read the same from either form, since TAT − base is a whole number of T.
//
// The word is the bucket's state only while the queue's lock does not hold
// it. The lock holds it (the word reads held) while anyone waits, once the
// limiter is stopped, and for good when T is not a whole number of ns (3/s,
// 30/s, 7.3/s: their due instants are rounded up one by one, which TAT
// cannot carry; they keep the locked path alone). A fast caller decides only
// on a word that is not held, and otherwise takes the locked path, so it can
// never pass a parked waiter nor take from a stopped limiter. Every locked
// operation first takes the word (bucket.hold: TAT becomes base = TAT −
// burst·T, credited 0, and the queue's avail stays 0; the next Fill
// credits from there), and the queue hands it back when the operation
// leaves nobody waiting (bucket.Settle, semaphore.Settler).

// held is the word's value while the queue's lock owns the state.
const held = math.MinInt64

// Bounds that keep the word's arithmetic within an int64: readings and
// TATs below fastLimit (73 years after the limiter was made), burst·T at
// most maxSpan. Beyond them the locked path decides.
const (
	fastLimit = 1 << 61
	maxSpan   = 1 << 60
)

// A fastWord is a bucket's state while nobody waits, for one rate and one
// burst: SetRate and SetBurst retire the word (it stays held for good) and
// start a new one, so a fast caller that loaded the old one cannot apply
// the old rate to the new state.
type fastWord struct {
	tat    atomic.Int64 // ns after the bucket's epoch at which it is full again; held while the lock owns the state
	period int64        // T: ns per token
	burst  int64
	span   int64 // burst·T
}

// newFastWord returns a held word for nanoRate and burst, or nil when the
// fast path cannot be exact for them (T not a whole number of ns) or its
// arithmetic would not fit.
func newFastWord(nanoRate uint64, burst int64) *fastWord {
	if nanoRate == 0 || nanoScale%nanoRate != 0 {
		return nil
	}
	period := nanoScale / nanoRate
	hi, span := bits.Mul64(period, uint64(burst))
	if hi != 0 || span > maxSpan {
		return nil
	}
	f := &fastWord{period: int64(period), burst: burst, span: int64(span)}
	f.tat.Store(held)
	return f
}

// nanos reads the limiter's clock as ns after its epoch (see Now: on real
// time, the monotonic clock alone, and a synctest bubble's fake time in a
// bubble).
func (b *bucket) nanos() int64 {
	if b.mono {
		return int64(time.Since(b.epoch))
	}
	return int64(b.clock.Now().Sub(b.epoch))
}

// tryFast takes n ≥ 1 tokens on the fast word. decided is false when the
// word is held (or there is none): the locked path must decide.
func (b *bucket) tryFast(n int64) (ok, decided bool) {
	f := b.fast.Load()
	if f == nil {
		return false, false
	}
	if n > f.burst {
		// More than a full bucket: never at once, whoever holds the state
		// (the queue keeps at most burst while nobody waits).
		return false, true
	}
	// The clock is read once, before the word: the window between the
	// load and the compare-and-swap is then a few instructions, and two
	// goroutines seldom collide in it. A reading older than the word's
	// last writer's (or than a retry's word) can only refuse, never grant
	// early: max(TAT, now) + n·T − now only grows as now goes back.
	if f.tat.Load() == held {
		return false, false // no clock read for nothing: the locked path reads its own
	}
	now := b.nanos()
	if uint64(now) >= fastLimit {
		return false, false // before the epoch (a mock set back) or 73 years on
	}
	for {
		tat := f.tat.Load()
		if tat == held {
			return false, false
		}
		t := max(tat, now) + n*f.period
		if t-now > f.span {
			return false, true
		}
		if f.tat.CompareAndSwap(tat, t) {
			return true, true
		}
	}
}

// hold brings the state under the queue's lock, if the fast word has it:
// every Source method that reads or writes the state calls it first. The
// queue's avail is 0 while the word has the state, so the bucket's form
// with avail 0 is base = TAT − burst·T, credited 0. The lock is held.
func (b *bucket) hold() {
	if b.held {
		return
	}
	f := b.fast.Load()
	tat := f.tat.Swap(held) // from now on a fast caller's CompareAndSwap fails
	b.base, b.credited, b.held = b.epoch.Add(time.Duration(tat-f.span)), 0, true
}

// Settle hands the state back to the fast word at the end of a locked
// operation that leaves nobody waiting on a running limiter (it is the
// bucket's semaphore.Settler method), and returns the units the queue
// keeps: 0 when the word has them, avail when the state stays under the
// lock (no fast word for this rate, or a TAT beyond its bounds). The lock is
// held.
func (b *bucket) Settle(_ time.Time, avail int64) int64 {
	f := b.fast.Load()
	if f == nil || !b.held {
		return avail
	}
	k := b.credited + b.burst - min(avail, b.burst) // whole periods from base to TAT
	if k > fastLimit/f.period {
		return avail
	}
	tat := int64(b.base.Sub(b.epoch)) + k*f.period
	if tat >= fastLimit {
		return avail
	}
	// A TAT before the epoch is a full bucket at every reading the fast
	// path accepts (now ≥ 0), as 0 is.
	f.tat.Store(max(tat, 0))
	b.held = false
	return 0
}

// refast retires the fast word after a change of rate or burst and starts
// one for the new values (held: the lock has the state now). The lock is
// held, and so is the state (hold was called).
func (b *bucket) refast() {
	b.fast.Store(newFastWord(b.nanoRate, b.burst))
}
