package sharedbucket

import (
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/sluice-go/sluice/internal/gcra"
)

// MaxKeyLen is the longest key the table accepts, in bytes.
const MaxKeyLen = 256

// maxCASTries bounds one spend's compare-and-swap loop. Two contenders on
// two cores lose a CAS rarely and never 1024 times in a row unless something
// else writes the slot's cache line on every iteration; past the bound the
// call fails open (or closed, see WithFailMode) and counts Contended.
const maxCASTries = 1024

// maxClaimRounds bounds the slot-claim loop the same way.
const maxClaimRounds = 64

// MaxSkew is how far back of the newest time any caller has used an
// explicit time (…At methods) may lie and still be judged exactly; see
// Table.AllowAt.
const MaxSkew = time.Second

// repairSlack: a writer stores at most its own clock reading + τ, and a
// reading is at most a preemption old when it is used. So a TAT more than
// τ + repairSlack ahead of a fresh reading is a damaged word (or comes from a
// caller of an …At method whose clock is more than MaxSkew behind the
// others'): a spend or a claim that meets it rewrites it to now+τ ("empty")
// and counts it in Corrupt, so a garbage word costs at most one bucket's
// worth of waiting instead of an arbitrary lockout. The comparison is the
// one the spend already makes to deny, so the hot path pays nothing for it.
const repairSlack = int64(MaxSkew)

// damaged reports whether a TAT ahead of now by ahead nanoseconds is
// impossible (see repairSlack): the one test spend, repair, claim and the
// queries apply to a TAT, so that a word one of them repairs is the word
// every other one takes for damaged.
func (t *Table) damaged(ahead int64) bool { return ahead > t.tau+repairSlack }

// slot is one key's state in the shared mapping. Both words change only by
// atomic operations; see the package doc for their meaning.
type slot struct {
	key atomic.Uint64 // keyed hash of the key; 0 = empty; lockBit: changing owner (lockWord)
	tat atomic.Int64  // theoretical arrival time, CLOCK_MONOTONIC ns
}

// Table is one policy's table of per-key buckets in a shared mapping. Every
// process that opens the same file shares its buckets.
//
// A Table is safe for use by many goroutines at once. No method blocks,
// except that a call that claims a slot for a new key waits for the other
// claims under way in that key's probe window: a few CASes, or at most
// about LockTimeout behind a process stopped mid-claim (see the package
// doc: a key never has two buckets). The
// zero Table is not usable: get one from Open or Arena.Rate. After Close
// every decision is a denial (and RetryAfter reports Never).
//
// Bad input never panics: an empty key, a key longer than MaxKeyLen, or a
// cost below 1 or above the burst makes AllowN (and Bucket.AllowN)
// return false and RetryAfterN return Never; those calls are not counted in
// Stats.
type Table struct {
	// Read-only after Open, and copied from the header: a peer scribbling on
	// the file's header later changes nothing here. These fields sit on the
	// lines every call reads and nothing on the hot path writes them.
	slots      unsafe.Pointer // first slot in the mapping
	mask       uint64         // slot count - 1
	interval   int64          // T, ns per token
	burst      int64          // b, tokens
	tau        int64          // b·T, ns
	hk         hasher         // keyed hash of this file's keys
	failClosed bool
	coarse     *coarseClock // nil: read CLOCK_MONOTONIC on every call
	closed     atomic.Bool  // set once, by Close

	counts *counters     // per-P allowed/denied
	rare   *rareCounters // evicted, contended, duplicates, recovered, corrupt

	base   unsafe.Pointer // mapping start
	size   uintptr        // mapping length
	path   string
	policy Policy // as the file's creator asked, Burst made explicit
	nslots int
	nonce  [16]byte
}

// rareCounters are written only on rare paths, but still kept off the lines
// the hot path reads.
type rareCounters struct {
	_          [64]byte
	evicted    atomic.Uint64
	contended  atomic.Uint64
	duplicates atomic.Uint64
	recovered  atomic.Uint64 // locks taken over from stopped holders
	corrupt    atomic.Uint64 // impossible words reset
	_          [24]byte
}

func newTable(path string, mem unsafe.Pointer, h *header, cfg *config) *Table {
	var coarse *coarseClock
	if cfg.coarse > 0 {
		coarse = startCoarseClock(cfg.coarse)
	}
	return &Table{
		coarse:     coarse,
		slots:      unsafe.Add(mem, headerSize),
		mask:       uint64(h.slots - 1),
		interval:   h.canon.interval,
		burst:      h.canon.burst,
		tau:        h.canon.tau(),
		hk:         newHasher(h.k0, h.k1),
		failClosed: cfg.failClosed,
		counts:     newCounters(),
		rare:       new(rareCounters),
		base:       mem,
		size:       uintptr(h.total),
		path:       path,
		policy:     Policy{Limit: h.limit, Window: h.window, Burst: h.canon.burst},
		nslots:     h.slots,
		nonce:      h.nonce,
	}
}

// now reads the table's clock: CLOCK_MONOTONIC, or the coarse clock's
// latest reading of it (see WithCoarseClock).
func (t *Table) now() int64 {
	if t.coarse != nil {
		return t.coarse.now.Load()
	}
	return nanotime()
}

// Allow is shorthand for AllowN(key, 1).
func (t *Table) Allow(key string) bool { return t.AllowN(key, 1) }

// AllowN reports whether cost tokens may be spent for key now, and spends
// them if so. A denial changes nothing in the table. It returns false for an
// invalid key or a cost outside [1, burst] (such a call could never succeed).
func (t *Table) AllowN(key string, cost int64) bool {
	if !t.validCall(key, cost) {
		return false
	}
	h := t.hk.hash(key)
	// Why the prefetch, and before the clock: on amd64 the clock read
	// (rdtscp, or lfence then rdtsc) waits for every earlier load to finish,
	// so a probe that starts after it pays its cache miss on top of the
	// clock. A prefetch is not waited for: the slot's line arrives while the
	// clock is read. What it saves shows in BenchmarkKeyed100k (a cache miss
	// per call), what it costs in BenchmarkSingleKey (a hot key): both in
	// this package, run with the prefetch and without it.
	prefetch(unsafe.Pointer(slotAt(t.slots, h&t.mask)))
	return t.decideFrom(h, cost, t.now(), true, nil).ok
}

// AllowAt is AllowN with an explicit time: now is a reading of the host's
// monotonic clock in nanoseconds (see Now), or any other clock all callers
// of this table share, in [0, 2^62). It returns false for a now outside
// that range.
//
// The bound holds for explicit times that lie within MaxSkew of one another:
// a caller may pass a time up to MaxSkew older than the newest time any
// caller has used (a decision dated that far back is judged against
// everything decided since, so it can only be tighter). Beyond MaxSkew a
// stored time looks like a damaged word and is repaired, which loosens.
func (t *Table) AllowAt(key string, cost, now int64) bool {
	if !t.validCall(key, cost) || !validNow(now) {
		return false
	}
	return t.decideFrom(t.hk.hash(key), cost, now, false, nil).ok
}

// Decision is one decision with its figures, all from the same read of the
// key's bucket (and, when allowed, the same compare-and-swap): what a
// service puts in its response headers.
type Decision struct {
	Allowed bool
	// Remaining is the tokens left in the bucket after the decision, as a
	// fraction in [0, burst].
	Remaining float64
	// RetryAfter is 0 when allowed; for a denial, how long until the same
	// request would be allowed if nobody else spends meanwhile. It is Never
	// when no wait can help (invalid key, cost outside [1, burst], closed
	// table).
	RetryAfter time.Duration
	// ResetAfter is how long until the bucket is full again.
	ResetAfter time.Duration
}

// Decide is shorthand for DecideN(key, 1).
func (t *Table) Decide(key string) Decision { return t.DecideN(key, 1) }

// DecideN is AllowN with the figures of the same decision: it costs one
// hash, one probe and (when allowed) one CAS, like AllowN. A call given up
// under contention (Stats.Contended) reports an empty bucket: Remaining 0,
// ResetAfter b·T and, when denied, RetryAfter cost·T.
func (t *Table) DecideN(key string, cost int64) Decision {
	if !t.validCall(key, cost) {
		return Decision{RetryAfter: Never}
	}
	h := t.hk.hash(key)
	prefetch(unsafe.Pointer(slotAt(t.slots, h&t.mask))) // see AllowN
	return t.decision(t.decideFrom(h, cost, t.now(), true, nil), cost)
}

// DecideAt is DecideN at an explicit time (see AllowAt).
func (t *Table) DecideAt(key string, cost, now int64) Decision {
	if !t.validCall(key, cost) || !validNow(now) {
		return Decision{RetryAfter: Never}
	}
	return t.decision(t.decideFrom(t.hk.hash(key), cost, now, false, nil), cost)
}

// decision turns an outcome into its figures.
func (t *Table) decision(o outcome, cost int64) Decision {
	// The debt of an outcome lies in [0, τ], so the quotient needs no clamp
	// (Go's float min and max cost a few ns for NaN handling).
	return Decision(gcra.Figures(o.ok, o.debt, cost*t.interval, t.interval, t.tau))
}

// outcome is what decideFrom found: the decision, the bucket's debt after it
// (ns; 0 is a full bucket) and the slot it used (nil if none).
type outcome struct {
	s    *slot
	debt int64
	ok   bool
}

// maxMoves bounds how often one decision follows its key to another slot
// (each move means the slot was taken over between the probe and the spend).
const maxMoves = 16

// decideFrom finds or claims h's slot (starting from s, a remembered slot
// that may have moved on, or nil) and spends cost on it at now. With live
// set, now is the caller's reading of the table's clock, which may be stale
// by the time the slot is probed (a preempted caller): the claim path
// re-reads the clock when it must, and a long CAS retry loop does too.
func (t *Table) decideFrom(h uint64, cost, now int64, live bool, s *slot) outcome {
	if s == nil {
		s = t.find(h)
	}
	if s != nil {
		need := cost * t.interval
		if tat, ok := t.spendOnce(s, h, now, need, t.tau-need); ok {
			t.counts.add(true)
			return outcome{s: s, debt: tat - now, ok: true}
		}
	}
	return t.decideRest(h, cost, now, live, s)
}

// decideRest is decideFrom after its first pass (spendOnce on s) did not
// allow, or with s nil when the key was not found: a denial, a slot that
// moved, a lost CAS, or a key that needs a slot.
func (t *Table) decideRest(h uint64, cost, now int64, live bool, s *slot) outcome {
	for range maxMoves {
		if s == nil {
			if s = t.find(h); s == nil {
				if s, now = t.claim(h, now, live); s == nil {
					break
				}
			}
		}
		switch r, debt := t.spend(s, h, cost, now, live); r {
		case spendAllowed:
			t.counts.add(true)
			return outcome{s: s, debt: debt, ok: true}
		case spendDenied:
			t.counts.add(false)
			return outcome{s: s, debt: debt}
		case spendContended:
			return t.gaveUp(s)
		}
		s = nil // the slot changed owner under us: find the key again
	}
	return t.gaveUp(nil)
}

// spendOnce is the common case of a spend in one pass, small enough to
// inline (the budget is tight: check with go build -gcflags=-m): the key's
// slot, one load of each word, one CAS. need is cost·T and room τ − need,
// computed by the caller before the load (see gcra.Step). It reports
// whether it spent need (and the TAT it stored), and false for anything
// else (a denial, a slot that moved, a lost CAS): decideFrom then decides.
func (t *Table) spendOnce(s *slot, h uint64, now, need, room int64) (int64, bool) {
	tat := s.tat.Load()
	if s.key.Load() != h {
		return 0, false
	}
	next, ok := gcra.Step(tat, now, need, room)
	return next, ok && s.tat.CompareAndSwap(tat, next)
}

// gaveUp records a call that gave up under contention and returns its
// answer: allowed (fail open) unless the handle fails closed, with the
// figures of an empty bucket.
func (t *Table) gaveUp(s *slot) outcome {
	ok := t.contended()
	t.counts.add(ok)
	return outcome{s: s, debt: t.tau, ok: ok}
}

// contended counts a call given up under contention and returns its
// answer: true (fail open) unless the handle fails closed.
func (t *Table) contended() bool {
	t.rare.contended.Add(1)
	return !t.failClosed
}

func (t *Table) validCall(key string, cost int64) bool {
	return len(key) != 0 && len(key) <= MaxKeyLen && cost >= 1 && cost <= t.burst && !t.closed.Load()
}

func validNow(now int64) bool { return now >= 0 && now < maxTau }

// Results of spend.
const (
	spendDenied = iota
	spendAllowed
	spendMoved // the slot no longer holds the key
	spendContended
)

// spend is the GCRA step (gcra.Step) on h's slot s: allowed iff
// max(tat, now) + cost·T − now ≤ τ, and then one CAS stores
// max(tat, now) + cost·T. A denial writes nothing (except to repair a
// damaged word). It returns the result and the
// debt after the decision.
//
// Why the key is read after the TAT and before the CAS: a slot changes owner
// only after its key word is locked (see claim), and the claimer then
// replaces the TAT with a value no earlier reader holds. So a CAS that lands
// was made against a TAT read while the slot still held h, and nothing
// changed the TAT in between: the spend is h's, never the next owner's.
//
// Why the clock is read before the loop and not between Load and CAS: the
// bound b + (e−s)/T holds for any decision time the caller used, and a
// reading older than the TAT only makes the answer tighter. But a clock read
// (BenchmarkClock) between Load and CAS is a window in which the other core
// takes the line back and wins every race: two goroutines on one key then
// exhaust maxCASTries and fail open. Without it the window is a Load and a
// compare. With refresh set (the live clock) a long retry sequence re-reads
// the clock.
func (t *Table) spend(s *slot, h uint64, cost, now int64, refresh bool) (int, int64) {
	need := cost * t.interval
	room := t.tau - need // outside the loop: see gcra.Step
	for try := 1; ; try++ {
		tat := s.tat.Load()
		if s.key.Load() != h {
			return spendMoved, 0
		}
		next, ok := gcra.Step(tat, now, need, room)
		d := next - now // debt in ns after the decision; 0 means the bucket is full
		if !ok {
			if t.damaged(d) {
				d = t.repair(s, tat, now, refresh)
			}
			return spendDenied, min(d, t.tau)
		}
		if s.tat.CompareAndSwap(tat, next) {
			return spendAllowed, d
		}
		if try == maxCASTries {
			return spendContended, 0
		}
		if try%16 == 0 {
			runtime.Gosched() // let whoever keeps winning the line finish
			if refresh {
				now = t.now()
			}
		}
	}
}

// repair rewrites a TAT that lies more than τ + repairSlack ahead of now to
// now+τ (an empty bucket: the bound holds from the next call, and no debt a
// real bucket could have is forgiven) and returns the debt it leaves,
// counting the rewrite in Corrupt. With the live clock it first re-reads
// the clock, so a caller that slept between its reading and its load
// (SIGSTOP, a long preemption) cannot mistake a fresh TAT for a damaged one.
func (t *Table) repair(s *slot, tat, now int64, refresh bool) int64 {
	if refresh {
		now = t.now()
		if !t.damaged(tat - now) {
			return max(tat-now, 0)
		}
	}
	if s.tat.CompareAndSwap(tat, now+t.tau) {
		t.rare.corrupt.Add(1)
	}
	return t.tau
}

// find is the read-only first pass: the first slot in h's probe window that
// holds h. It scans the whole window (never stopping at an empty slot), so
// Forget needs no tombstones, and it runs before any claim, so a key whose
// slot lies further along is never handed a fresh bucket in front of it.
func (t *Table) find(h uint64) *slot {
	home := h & t.mask
	for i := range uint64(probeWindow) {
		s := slotAt(t.slots, (home+i)&t.mask)
		if s.key.Load() == h {
			return s
		}
	}
	return nil
}

func slotAt(slots unsafe.Pointer, i uint64) *slot {
	return (*slot)(unsafe.Add(slots, i*slotSize))
}
