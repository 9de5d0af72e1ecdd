// When the lock-free path decides, and what a rate without it costs (why
// it is exact: below, at "The fast path").
//
// A take that finds its tokens there with nobody waiting (TryAcquire, and
// Acquire with ctx not done) is decided by one clock read and one
// compare-and-swap on a single word, without the lock, when the token
// interval 1/rate is a whole number of nanoseconds (1/s, 5/s, 10/s, 100/s,
// 1000/s, 1e9/s, 0.5/s) or of 1/k ns for k up to 64 (3/s, 30/s, 60/s,
// 7/s). For those the word covers the limiter's first fastLimit/k ns: 1.1
// years at worst (k = 64), 73 years at k = 1; past that the lock takes
// over. A rate that is neither (7.3/s: 1/73 ns) takes the queue's lock for
// every call, exactly as precise, and slower: BenchmarkTryAcquire in bench/
// measures impl=sluice-locked (a rate of 7.3e8/s) against impl=sluice, 1.66
// times the cost on one goroutine in docs/benchmarks.md's peer table (60.3
// against 36.4 ns). Either way the answers are the same to the nanosecond,
// and a take never passes a parked Acquire: while anyone waits, or once
// stopped, every call goes through the lock.

package ratelimiter

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/internal/gcra"
	"github.com/sluice-go/sluice/internal/monotime"
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
// When T is not a whole number of ns but is one of 1/k ns for a small k
// (3/s, 30/s, 60/s: k = 3), the same holds in units of 1/k ns: the locked
// model's instants are whole ns (readings, base) and token i is due at
// base + ceil(i·T), that is, at the first whole ns at or after
// k·base + i·kT units, which is the GCRA's test on TAT in units with now
// in units (k·now). Only the conversion back to a whole-ns base needs care
// (see hold).
//
// The word is the bucket's state only while the queue's lock does not hold
// it. The lock holds it (the word reads held) while anyone waits, once the
// limiter is stopped, and for good when T is a whole number of 1/k ns for
// no k up to maxUnits (7.3/s: 1/73 ns; such rates keep the locked path
// alone). A fast caller decides only on a word that is not held, and
// otherwise takes the locked path, so it can never pass a parked waiter
// nor take from a stopped limiter. The queue hands the word the state when
// an operation leaves nobody waiting (bucket.Settle) and takes it back
// before the next locked operation (bucket.Hold: TAT becomes a base and
// credited with the queue's avail 0; the next Fill credits from there); it
// is the queue.Settler protocol.

// held is the word's value while the queue's lock owns the state.
const held = math.MinInt64

// Bounds that keep the word's arithmetic within an int64: readings and
// TATs below fastLimit units (73 years after the limiter was made when a
// unit is a ns), (burst + k − 1) periods at most maxSpan units. Beyond them
// the locked path decides.
const (
	fastLimit = 1 << 61
	maxSpan   = 1 << 60
)

// maxUnits bounds k, the word's unit being 1/k ns: a rate whose interval
// is a whole number of 1/k ns for no k up to maxUnits takes the locked path.
// The word's range shrinks with k (fastLimit/k ns: about 1.1 years at 64).
const maxUnits = 64

// A fastWord is a bucket's state while nobody waits, for one rate and one
// burst: SetRate and SetBurst retire the word (it stays held for good) and
// start a new one, so a fast caller that loaded the old one cannot apply
// the old rate to the new state.
//
// Its unit is 1/k ns, k the least for which T is a whole number of units
// (k = 1 for 10/s; 3 for 3/s, 30/s and 60/s): the locked model's instants
// are whole ns and its k-th token is due at base + ceil(k·T), which in 1/k
// ns units is exactly GCRA's k·base + k·T·i, floor for floor.
type fastWord struct {
	unit   int64 // k: units per ns
	period int64 // k·T: units per token
	burst  int64
	span   int64 // burst·period
	inv    int64 // the inverse of period mod k, mod k (for hold; 0 when k = 1)
	limit  int64 // fastLimit/k: readings in ns below it fit in units
	// tat has a cache line of its own (the struct is 128 bytes, so the
	// allocator aligns it to 128): a compare-and-swap on one core then
	// does not evict the constants above from the other's cache.
	_   [64 - 6*8]byte
	tat atomic.Int64 // units after the bucket's epoch at which it is full again; held while the lock owns the state
	_   [64 - 8]byte
}

// newFastWord returns a held word for nanoRate and burst, or nil when the
// fast path cannot be exact for them (T not a whole number of 1/k ns for
// any k up to maxUnits) or its arithmetic would not fit.
func newFastWord(nanoRate uint64, burst int64) *fastWord {
	if nanoRate == 0 {
		return nil
	}
	g := gcd(nanoScale, nanoRate)
	k, period := nanoRate/g, nanoScale/g // period/k = 1e18/nanoRate = T, in lowest terms
	if k > maxUnits {
		return nil
	}
	// hold may count up to burst + k − 1 periods back from TAT.
	hi, lo := bits.Mul64(period, uint64(burst)+k-1)
	if hi != 0 || lo > maxSpan {
		return nil
	}
	f := &fastWord{unit: int64(k), period: int64(period), burst: burst, span: int64(period) * burst, limit: fastLimit / int64(k)}
	for i := int64(1); i < f.unit; i++ {
		if f.period%f.unit*i%f.unit == 1 { // period and k are coprime: one i fits
			f.inv = i
		}
	}
	f.tat.Store(held)
	return f
}

func gcd(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// nanos reads the limiter's clock as ns after its epoch (see Now: on real
// time, the monotonic clock alone, and a synctest bubble's fake time in a
// bubble).
func (b *bucket) nanos() int64 {
	if b.mono {
		return monotime.Now() - b.origin
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
	//
	// Why the word is not looked at before the clock is read (to spare the
	// reading when the word is held): on two cores taking at once, that
	// look is one more transfer of the word's cache line per call, and a
	// held word means the caller parks or is refused, which costs far more
	// than a clock reading anyway.
	now := b.nanos()
	if uint64(now) >= uint64(f.limit) {
		return false, false // before the epoch (a mock set back), or beyond the word's range
	}
	now *= f.unit
	// The step is the stores' (gcra.Step), in the word's units: a take of n
	// needs n periods and fits while the debt stays within span. Its
	// preconditions hold: 0 < need ≤ span (1 ≤ n ≤ burst) and now ≥ 0.
	need := n * f.period
	room := f.span - need
	for {
		tat := f.tat.Load()
		if tat == held {
			return false, false
		}
		t, ok := gcra.Step(tat, now, need, room)
		if !ok {
			return false, true
		}
		if f.tat.CompareAndSwap(tat, t) {
			return true, true
		}
	}
}

// Hold brings the state under the queue's lock from the fast word (it is
// the bucket's queue.Settler method; the queue calls it first in every
// locked operation after a Settle that gave the word the state). The
// queue's avail is 0 while the word has the state, so the bucket's form
// is TAT = base + (credited + burst)·T: with whole-ns T, base = TAT − burst·T
// and credited 0. With T = period/k, base must still be a whole ns, so
// m = credited + burst periods back from TAT must leave a multiple of k:
// m ≡ TAT·period⁻¹ (mod k), the least such m ≥ burst. It returns 0: the
// tokens come back as credit, through the next Fill. The lock is held.
func (b *bucket) Hold() int64 {
	f := b.fast.Load()
	tat := f.tat.Swap(held) // from now on a fast caller's CompareAndSwap fails
	m := b.burst
	if f.unit > 1 {
		m0 := tat % f.unit * f.inv % f.unit // tat ≥ 0 while the word has the state
		m += ((m0-b.burst)%f.unit + f.unit) % f.unit
	}
	// Exact: tat − m·period is a multiple of k.
	b.base, b.credited = b.epoch.Add(time.Duration((tat-m*f.period)/f.unit)), m-b.burst
	return 0
}

// Settle hands the state, with the queue's avail tokens, to the fast word
// at the end of a locked operation that leaves nobody waiting on a running
// limiter (it is the bucket's queue.Settler method), and reports whether
// it did: false when the state stays under the lock (no fast word for this
// rate, or a TAT beyond its bounds). The lock is held.
func (b *bucket) Settle(avail int64) bool {
	f := b.fast.Load()
	if f == nil {
		return false
	}
	m := b.credited + b.burst - min(avail, b.burst) // whole periods from base to TAT
	base := int64(b.base.Sub(b.epoch))
	if m > fastLimit/f.period || base >= f.limit || base <= -f.limit {
		return false
	}
	tat := base*f.unit + m*f.period
	if tat >= fastLimit {
		return false
	}
	// A TAT before the epoch is a full bucket at every reading the fast
	// path accepts (now ≥ 0), as 0 is.
	f.tat.Store(max(tat, 0))
	return true
}

// refast retires the fast word after a change of rate or burst and starts
// one for the new values (held: the lock has the state now). The lock is
// held, and so is the state (the queue holds it in every locked operation).
func (b *bucket) refast() {
	b.fast.Store(newFastWord(b.nanoRate, b.burst))
}
