package ratelimiter

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/internal/loopctx"
	"github.com/sluice-go/sluice/internal/monotime"
	"github.com/sluice-go/sluice/internal/queue"
)

// The refill: bucket, the queue.Queue Source of a Limiter. Tokens accrue
// from base at rate per second: by time now, accrued(now) =
// floor((now−base)·rate) whole tokens, of which credited have been given to
// the queue already. Crediting is lazy: every decision (and the refill
// timer) first credits the whole tokens accrued since the last credit, so
// the fraction carries over by itself and no state ticks while nobody looks.
// While someone waits, credit flows to the queue uncapped, so the head can
// collect n > Burst; when nobody waits the queue keeps at most Burst, and a
// full bucket moves base to now: idle time is never banked beyond Burst.
//
// Why not one timer tick per token (a ticker fiber feeding the bucket): a timer
// per token costs a wake-up per token even when nobody waits, and keeps a
// run alive. Here the refill alarm is armed only while someone waits, for
// the exact instant the head's last missing token accrues,
// base + due(credited + need): one wake per grant.

// Tokens accrue in exact integer arithmetic: the rate is held in
// nanotokens per second (rate·1e9, so 7.3/s is exactly 7_300_000_000), and
// d nanoseconds after base floor(d·nanoRate/1e18) whole tokens have accrued.
// The k-th token is due exactly ceil(k·1e18/nanoRate) ns after base, so a
// rate of 7.3/s delivers token 26280 at exactly 3600 s, with no float
// rounding to drift or to disagree between "is it due" and "when is it due".
const nanoScale = 1_000_000_000_000_000_000 // 1e18: ns per s × nanotokens per token

// bucket is a Limiter's token source. Its state is guarded by the queue's
// lock (every Source method runs under it), except while the queue has
// settled it into the fast word (see fast.go), where Hold finds it.
type bucket struct {
	clock  loopctx.Clock
	mono   bool                     // real time outside any bubble, read as epoch plus monotime.Now() − origin (see Now)
	origin int64                    // when mono, monotime.Now() just before epoch was read
	epoch  time.Time                // the first reading; the origin of every later one when mono, and of the fast word's
	fast   atomic.Pointer[fastWord] // nil when this rate and burst have no fast path

	rate     float64   // tokens per second, as given
	nanoRate uint64    // rate·1e9, rounded: the refill's exact arithmetic
	burst    int64     // the most the bucket keeps while nobody waits
	base     time.Time // accrual origin: tokens accrue from here
	credited int64     // whole tokens credited since base
	setAt    time.Time // the last SetRate or SetBurst (see Return)
	dropped  amount    // tokens the bucket could not hold, exactly (see Return)
}

// An amount is whole + frac/nanoScale tokens, 0 ≤ frac < nanoScale: the
// exact arithmetic of what comes back to the bucket and what it drops.
type amount struct {
	whole int64
	frac  uint64
}

func (a amount) plus(c amount) amount {
	a.whole += c.whole
	if a.frac += c.frac; a.frac >= nanoScale {
		a.whole, a.frac = a.whole+1, a.frac-nanoScale
	}
	return a
}

func (a amount) minus(c amount) amount {
	a.whole -= c.whole
	if a.frac < c.frac {
		a.whole, a.frac = a.whole-1, a.frac+nanoScale
	}
	a.frac -= c.frac
	return a
}

func (a amount) positive() bool  { return a.whole > 0 || a.whole == 0 && a.frac > 0 }
func (a amount) tokens() float64 { return float64(a.whole) + float64(a.frac)/nanoScale }

// accrued returns the whole tokens accrued d after base, and the fraction of
// the next one in units of 1/nanoScale.
func (b *bucket) accrued(d time.Duration) (whole int64, frac uint64) {
	if d <= 0 {
		return 0, 0
	}
	hi, lo := bits.Mul64(uint64(d), b.nanoRate)
	if hi == 0 {
		// Under 2^64: a division by a constant, which the compiler turns
		// into a multiplication (Div64 is a hardware divide).
		return int64(lo / nanoScale), lo % nanoScale
	}
	// hi < nanoScale always: d < 2^63 and nanoRate ≤ 1e18 (rate ≤ 1e9/s).
	q, r := bits.Div64(hi, lo, nanoScale)
	if q > math.MaxInt64/2 {
		return math.MaxInt64 / 2, 0
	}
	return int64(q), r
}

// reached reports whether k whole tokens have accrued d after base:
// floor(d·nanoRate/nanoScale) ≥ k, that is d·nanoRate ≥ k·nanoScale, compared
// in 128 bits, exactly.
func (b *bucket) reached(d time.Duration, k int64) bool {
	if d <= 0 || k <= 0 {
		return k <= 0
	}
	hi, lo := bits.Mul64(uint64(d), b.nanoRate)
	khi, klo := bits.Mul64(uint64(k), nanoScale)
	return hi > khi || hi == khi && lo >= klo
}

// due returns the offset from base at which k whole tokens have accrued, or
// neverDelay when that is beyond any timer.
func (b *bucket) due(k int64) time.Duration {
	hi, lo := bits.Mul64(uint64(k), nanoScale)
	if hi >= b.nanoRate {
		return neverDelay
	}
	q, r := bits.Div64(hi, lo, b.nanoRate)
	if r != 0 {
		q++
	}
	if q >= uint64(neverDelay) {
		return neverDelay
	}
	return time.Duration(q)
}

// Now reads the limiter's clock. On real time outside a synctest bubble it
// reads the monotonic clock alone (monotime.Now): time.Now reads two clocks
// (wall and monotonic) where one will do, and time.Since would also ask,
// per call, whether the caller is in a bubble. The reading is epoch plus
// the monotonic time elapsed since origin, a reading taken just before
// epoch, so it is never behind time.Now (ahead by the gap between the two
// first readings) and orders and subtracts as time.Now would against any reading that
// carries a monotonic part (a ctx deadline from WithTimeout does). Its wall
// part drifts from the host's if the wall clock is stepped; the one wall
// comparison left is Acquire's "fails at once" check against a deadline made
// from a wall time alone (WithDeadline of a time.Date), which is then off by
// that step.
//
// A limiter made inside a testing/synctest bubble reads the clock it was
// given (time.Now, the bubble's fake time, whose readings carry no monotonic
// part), so it refills on fake time, exactly (TestSynctest).
func (b *bucket) Now() time.Time {
	if b.mono {
		return b.epoch.Add(time.Duration(monotime.Now() - b.origin))
	}
	return b.clock.Now()
}

// Fill credits the whole tokens accrued by now. A reading of now older than
// base (another caller read the clock later and got the lock first) credits
// nothing and never moves base back.
func (b *bucket) Fill(now time.Time, avail, _ int64, waiting bool) int64 {
	if !waiting && avail >= b.burst {
		if avail > b.burst {
			// Left over from a head of n > burst granted late (a late
			// timer credits what accrued meanwhile): the bucket keeps
			// burst, and the rest is dropped.
			b.drop(amount{whole: avail - b.burst})
		}
		b.restart(now) // full: nothing accrues, fraction included
		return b.burst
	}
	d := now.Sub(b.base)
	if !waiting && b.reached(d, b.credited+b.burst-avail) {
		// Full again (the usual case of a limiter that is seldom empty):
		// told by two multiplications, without accrued's division.
		b.restart(now)
		return b.burst
	}
	whole, _ := b.accrued(d)
	if k := whole - b.credited; k > 0 {
		b.credited = whole
		avail += k
	}
	if !waiting && avail >= b.burst {
		b.restart(now)
		return b.burst
	}
	return avail
}

// restart moves the accrual origin to now, if now is later.
func (b *bucket) restart(now time.Time) {
	if now.After(b.base) {
		b.base, b.credited = now, 0
	}
}

// Due is the instant the (n − avail)-th token after those credited
// accrues.
func (b *bucket) Due(_ time.Time, avail, n int64) (time.Time, bool) {
	return b.base.Add(b.due(b.credited + n - avail)), true
}

func (b *bucket) Take(int64) int64 { return 0 }

// Return takes back n tokens of a grant made at granted: a grant whose
// caller's ctx ended before Acquire returned, or what a head had collected
// when it left the queue without its grant (made and handed back at once,
// see the queue's leaveLocked). avail is the bucket's whole tokens without
// them, credited up to now. Call L the bucket's level: avail plus what has
// accrued since the last credit. The hand-back rule:
//
//   - of a grant of n, at most burst is worth anything; handed back d
//     after it was made, less d·rate, what the bucket has accrued
//     meanwhile (and nothing if SetRate or SetBurst came in between);
//   - that worth goes in only as far as L stays within max(burst, L
//     before it); at the cap the accrued fraction goes too, and accrual
//     starts over from now, as for a full bucket.
//
// What does not go in is dropped and counted (bucket.dropped), so every
// token a leaver held is granted later, stays in the bucket, or is
// counted.
//
// Why, and why it is enough: the bound is that calls of n ≤ burst are
// granted at most B + ∫rate tokens in any window [s, e], B the largest
// burst in force in it (at the instant of a SetBurst, the one before it
// too), on a clock whose timers fire at their instant (a loop's, a
// testing/synctest bubble's). Take a virtual bucket V that is full (B) at
// s, refills at the rate up to B, and pays for every such grant in the
// window: the bound holds if V never runs short. Let P be the worth of the
// grants made and not yet handed back (by the rule above, as if handed
// back now: it shrinks at the rate, as L grows).
//
//   - L + P ≤ burst (at the instant of a change, the larger one) while
//     P > 0, or the head asks n ≤ burst, or nobody waits. A grant of
//     h ≤ burst moves h from L to P; while P > 0, L gains what P loses; a
//     later change of rate or burst empties P; a hand-back adds to L at
//     most its worth, which leaves P; a leaver's collection is capped at
//     burst. Only a head of n > burst takes L past burst, and with P = 0;
//     no call of n ≤ burst is granted meanwhile (FIFO, no barging); it is
//     granted all at once, leaving under a nanosecond's accrual, or
//     leaves, capped.
//   - So min(L + P, B) starts at most B, as V does, grows at most at the
//     rate, never jumps up (a hand-back moves worth from P to L; a grant
//     of n > burst handed back is worth burst, and L was at least n), and
//     falls by exactly n at each grant of n ≤ burst, as V does. Hence
//     V ≥ min(L + P, B) ≥ L ≥ n at every such grant, to within a
//     nanosecond's accrual.
//
// Handing every collected token on instead let a head of n > burst give
// the callers behind it up to n − 1 tokens in one instant. On fibers and
// in a bubble a grant is handed back at its own instant (the caller
// resumes before time moves), so only the cap applies; on real time, d is
// the microseconds the caller took to notice its ctx, and a timer fires
// late by as much: the tokens that accrued meanwhile are granted at once,
// as x/time/rate's Wait returns late, so the bound is one of the instants
// the tokens were due.
func (b *bucket) Return(now, granted time.Time, avail, n, _ int64) int64 {
	worth := amount{whole: min(n, b.burst)}
	if d := now.Sub(granted); d > 0 {
		if !granted.After(b.setAt) {
			worth = amount{}
		} else {
			whole, frac := b.accrued(d)
			if worth = worth.minus(amount{whole, frac}); !worth.positive() {
				worth = amount{}
			}
		}
	}
	b.drop(amount{whole: n}.minus(worth))
	return b.put(now, avail, worth)
}

// put adds y tokens to a bucket of avail whole tokens credited up to now,
// as far as its level stays within max(burst, its level before), and
// drops the rest (see Return). The fraction of y goes to the accrual: base
// moves back by the time it takes to accrue.
func (b *bucket) put(now time.Time, avail int64, y amount) int64 {
	if !y.positive() {
		return avail
	}
	if !(amount{whole: b.burst}).minus(b.level(now, avail)).positive() {
		// Full already, or past it with a head of n > burst collecting.
		b.drop(y)
		return avail
	}
	avail += y.whole
	if y.frac > 0 {
		back := y.frac / b.nanoRate
		b.base = b.base.Add(-time.Duration(back))
		b.drop(amount{frac: y.frac - back*b.nanoRate}) // under a ns of accrual
	}
	return b.clip(now, avail)
}

// level returns the tokens in a bucket of avail whole tokens at now: avail
// and what has accrued since the last credit. A reading older than the
// last credit sees avail alone.
func (b *bucket) level(now time.Time, avail int64) amount {
	l := amount{whole: avail}
	if now.After(b.base) {
		if whole, frac := b.accrued(now.Sub(b.base)); whole >= b.credited {
			l = l.plus(amount{whole - b.credited, frac})
		}
	}
	return l
}

// clip keeps the bucket's level at most burst: what is beyond, the
// accrued fraction included, is dropped, and accrual starts over from now,
// as for a full bucket. It returns the whole tokens kept.
func (b *bucket) clip(now time.Time, avail int64) int64 {
	over := b.level(now, avail).minus(amount{whole: b.burst})
	if !over.positive() {
		return avail
	}
	b.drop(over)
	b.restart(now)
	return b.burst
}

// drop counts tokens the bucket could not hold.
func (b *bucket) drop(a amount) { b.dropped = b.dropped.plus(a) }

func (b *bucket) check(int) error          { return nil }
func (b *bucket) params() (float64, int64) { return float64(b.nanoRate) / 1e9, b.burst }

// setRate changes the rate at now, keeping the fraction of a token accrued
// at the old rate: base moves so that the same fraction has accrued at the
// new one. Tokens accrued by now have been credited (Do fills first).
func (b *bucket) setRate(now time.Time, rate float64) error {
	nr := uint64(math.Round(rate * 1e9))
	if now.After(b.base) {
		_, frac := b.accrued(now.Sub(b.base))
		// frac/nanoScale of a token takes frac/nanoRate' ns at the new rate.
		back := frac / nr
		b.base, b.credited = now.Add(-time.Duration(back)), 0
		b.drop(amount{frac: frac - back*nr}) // under a ns of accrual
	}
	b.rate, b.nanoRate = rate, nr
	b.setAt = now
	b.refast()
	return nil
}

// setBurst changes the burst at now. A bucket that holds more than the new
// burst while nobody waits keeps burst and drops the rest (a head's
// collection stays its own until it leaves).
func (b *bucket) setBurst(s *queue.State, burst int64) error {
	b.burst, b.setAt = burst, s.Now
	b.refast()
	if !s.Waiting {
		s.Avail = b.clip(s.Now, s.Avail)
	}
	return nil
}

// tokens returns the tokens in the bucket with the fraction of the next one
// accrued so far, in [0, Burst]; 0 while anyone waits (what accrues is the
// head's).
func (b *bucket) tokens(now time.Time, avail int64, waiting bool) float64 {
	if waiting {
		return 0
	}
	t := float64(avail)
	if avail < b.burst && now.After(b.base) {
		_, frac := b.accrued(now.Sub(b.base))
		t += float64(frac) / nanoScale
	}
	return min(t, float64(b.burst))
}
