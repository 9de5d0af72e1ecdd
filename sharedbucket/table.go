package sharedbucket

import (
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"
)

// MaxKeyLen is the longest key the table accepts, in bytes.
const MaxKeyLen = 256

// maxCASTries bounds one spend's compare-and-swap loop. Two contenders on
// two cores lose a CAS rarely and never 1024 times in a row unless something
// else writes the slot's cache line on every iteration; past the bound the
// call fails open (or closed, see FailClosed) and counts Contended.
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

// lockBit marks a key word whose slot is changing owner (see takeOver); the
// other 63 bits say when and by which process (see lockWord). Hashes never
// have it set.
const lockBit = uint64(1) << 63

// slot is one key's state in the shared mapping. Both words change only by
// atomic operations; see the package doc for their meaning.
type slot struct {
	key atomic.Uint64 // keyed hash of the key; 0 = empty; lockBit: changing owner (lockWord)
	tat atomic.Int64  // theoretical arrival time, CLOCK_MONOTONIC ns
}

// Table is one policy's table of per-key buckets in a shared mapping. Every
// process that opens the same file shares its buckets.
//
// A Table is safe for use by many goroutines at once. No method blocks. The
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
	// clock is read. With 100k keys (a miss per call) this took Allow from 73
	// to 56 ns on an Intel VM; on a hot key it costs under 1 ns.
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
	d := Decision{Allowed: o.ok, Remaining: float64(t.tau-o.debt) / float64(t.interval), ResetAfter: time.Duration(o.debt)}
	if !o.ok {
		d.RetryAfter = t.retryAfter(o.debt, cost)
	}
	return d
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
		if debt, ok := t.spendOnce(s, h, cost, now); ok {
			t.counts.add(true)
			return outcome{s: s, debt: debt, ok: true}
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
// inline: the key's slot, one load of each word, one CAS. It reports
// whether it spent cost (and the debt after), and false for anything else
// (a denial, a slot that moved, a lost CAS): decideFrom then decides.
func (t *Table) spendOnce(s *slot, h uint64, cost, now int64) (int64, bool) {
	tat := s.tat.Load()
	if s.key.Load() != h {
		return 0, false
	}
	need := cost * t.interval
	var d int64
	if tat > now { // compare first: tat − now cannot overflow then
		d = tat - now
	}
	return d + need, d <= t.tau-need && s.tat.CompareAndSwap(tat, now+d+need)
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

// spend is the GCRA step on h's slot s: allowed iff max(tat, now) + cost·T −
// now ≤ τ, and then one CAS stores max(tat, now) + cost·T. A denial writes
// nothing (except to repair a damaged word). It returns the result and the
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
// (~20–40 ns) between Load and CAS is a window in which the other core takes
// the line back and wins every race: measured, two goroutines on one key then
// exhaust 1024 tries and fail open. Without it the window is a few ns. With
// refresh set (the live clock) a long retry sequence re-reads the clock.
func (t *Table) spend(s *slot, h uint64, cost, now int64, refresh bool) (int, int64) {
	need := cost * t.interval
	for try := 1; ; try++ {
		tat := s.tat.Load()
		if s.key.Load() != h {
			return spendMoved, 0
		}
		var d int64    // debt in ns; 0 means the bucket is full
		if tat > now { // compare first: tat − now cannot overflow then
			d = tat - now
		}
		if d > t.tau-need {
			if d > t.tau+repairSlack {
				d = t.repair(s, tat, now, refresh)
			}
			return spendDenied, min(d, t.tau)
		}
		if s.tat.CompareAndSwap(tat, now+d+need) {
			return spendAllowed, d + need
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
		if tat-now <= t.tau+repairSlack {
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

// Kinds of slot claim picks, best first.
const (
	takeEmpty   = iota // key word 0: nobody's
	takeReclaim        // its bucket is full: no state to lose
	takeEvict          // every slot is live: the one nearest to full
)

// claim gives h a slot in its probe window and returns it with the decision
// time to use (a live caller may re-read the clock). It prefers an empty
// slot, then the slot whose bucket has been full the longest, and when every
// slot holds a live bucket it evicts the one nearest to full (counted in
// Evicted). It returns nil only when it gives up under contention.
//
// The floor: a key whose bucket was full at time r may lose its slot at r;
// the claimer first raises the key's floor word to r (one of 256 in the
// file's first page, chosen by the key's hash). Whoever later claims a new
// slot for a key starts its bucket at the key's floor: a decision dated
// before the floor (a caller preempted between its clock read and its probe,
// or an …At time within MaxSkew) then sees the debt the lost bucket could
// still have had, instead of a fresh bucket. A live caller re-reads the
// clock instead, so it is dated after the floor and loses nothing.
func (t *Table) claim(h uint64, now int64, live bool) (*slot, int64) {
	home := h & t.mask
	for round := range maxClaimRounds {
		var pick *slot
		var pk, ppos uint64
		var ptat int64
		kind := takeEvict + 1
		locked := false
		for i := range uint64(probeWindow) {
			j := (home + i) & t.mask
			s := slotAt(t.slots, j)
			k := s.key.Load()
			if k&lockBit != 0 || k != 0 && !t.inWindow(k, j) {
				if !t.clearSlot(s, k, now, live, round == maxClaimRounds/2-1) {
					locked = true // another claim is under way here
					continue
				}
				k = 0
			}
			switch {
			case k == h:
				return s, now // claimed by someone else since our first pass
			case k == 0:
				if kind > takeEmpty {
					pick, pk, ppos, kind = s, k, i, takeEmpty
				}
			default:
				tat := s.tat.Load()
				if tat > now && tat-now > t.tau+repairSlack {
					// Impossible (see repairSlack): whether its key is
					// real or garbage, make it an empty bucket that
					// refills, so the slot does not stay live for ever.
					tat = now + t.repair(s, tat, now, live)
				}
				c := takeEvict
				if tat <= now {
					c = takeReclaim
				}
				if c < kind || c == kind && tat < ptat {
					pick, pk, ppos, ptat, kind = s, k, i, tat, c
				}
			}
		}
		if locked && round < maxClaimRounds/2 {
			// Why wait: the claim under way may be for h too (racing first
			// requests for a new key, from several processes at once);
			// taking another slot now would give h two. A claim holds its
			// lock for a few CASes, so this wait is short. A locker that
			// died mid-claim costs claims in this window the wait until, at
			// the last waiting round, its process is found gone, or its
			// lock is LockTimeout old (see clearSlot).
			runtime.Gosched()
			continue
		}
		if pick == nil {
			continue
		}
		var ok bool
		if ok, now = t.takeOver(pick, pk, h, now, live, kind); ok {
			s := t.settle(h, home, ppos, pick)
			// An incarnation of h that lived and lost its slot entirely
			// while we claimed ours raised h's floor after we read it:
			// carry it over.
			t.raiseTAT(s, t.floorWord(h).Load())
			return s, now
		}
	}
	return nil, now
}

// inWindow reports whether slot j lies in the probe window of key word k:
// no claim puts a key anywhere else, so a key word outside is damage.
func (t *Table) inWindow(k, j uint64) bool { return (j-k)&t.mask < probeWindow }

// clearSlot empties slot s, whose key word k is a lock or a key outside its
// probe window, if it may (see unlock): a key outside its window, or an
// invalid lock, at once (counted in Corrupt); a lock LockTimeout old, or
// one whose process is gone (asked only with ask set: a syscall), counted
// in Recovered. It reports whether the slot is now empty of k.
func (t *Table) clearSlot(s *slot, k uint64, now int64, live, ask bool) bool {
	st := lockInvalid
	if k&lockBit != 0 {
		st = t.judgeLock(k, now, live)
		if st == lockHeld && ask && holderGone(k) {
			st = lockStale
		}
	}
	return st != lockHeld && t.unlock(s, k, st)
}

// takeOver moves slot s from key word k to h. Every step is one CAS, in an
// order that keeps every other party's view safe:
//
//  1. raise the old owner's floor to now (before anyone can miss it);
//  2. lock the key word (k → a lock word with this claim's time and
//     process id): the old owner's spends now fail their key check, and
//     other claimers skip the slot;
//  3. read h's floor (only now: any earlier incarnation of h that has lost
//     its slot raised it before its slot was locked) and replace the TAT
//     with h's starting value: a bucket full at the claim's time, or at the
//     floor if that is later. It differs from (for a reclaim: exceeds) the
//     TAT read, so no spend by the old owner that read that TAT earlier can
//     land afterwards. A reclaim whose bucket turned live again meanwhile is
//     abandoned and the key word restored;
//  4. publish h in the key word.
//
// Why the bucket starts at the claim's time (a fresh reading for a live
// caller) and not at the floor alone: a bucket full since some earlier time
// would serve a decision dated before the bucket existed (a caller of h
// held up between its clock read and its spend, or an …At time a little
// behind) with a full burst, on top of what h's previous bucket gave for
// that time. Started at the claim's time, such a decision sees the debt
// of a bucket that filled up only by then.
//
// A process killed or stopped between 2 and 4 leaves the slot locked; the
// next claim takes the lock over once it is LockTimeout old or its process
// is gone (see unlock for why that is safe even if the holder wakes).
func (t *Table) takeOver(s *slot, k, h uint64, now int64, live bool, kind int) (bool, int64) {
	if live {
		now = t.now() // the claim's time (see above)
	}
	if k != 0 {
		t.raiseFloor(k, now)
	}
	stamp := now
	if live && t.coarse != nil {
		// A lock's time is a fresh reading taken after the scan saw the
		// slot free (see unlock), not the coarse clock's, which may lag.
		stamp = nanotime()
	}
	lock := lockWord(stamp)
	if !s.key.CompareAndSwap(k, lock) {
		return false, now
	}
	if testHookTakeOver != nil {
		testHookTakeOver(s, 1)
	}
	var floor int64
	floor, now = t.floorFor(h, now, live)
	for {
		w := s.tat.Load()
		if s.key.Load() != lock {
			return false, now // taken over as stale (see unlock)
		}
		init := max(floor, now)
		switch {
		case kind == takeReclaim && w > now:
			// The owner spent since we looked: its bucket is live again.
			s.key.CompareAndSwap(lock, k)
			return false, now
		case kind == takeReclaim:
			init = max(init, w+1)
		case init == w:
			init++
		}
		if s.tat.CompareAndSwap(w, init) {
			break
		}
	}
	if testHookTakeOver != nil {
		testHookTakeOver(s, 2)
	}
	if kind == takeEvict {
		t.rare.evicted.Add(1)
		if testHookEvict != nil {
			testHookEvict(k)
		}
	}
	return s.key.CompareAndSwap(lock, h), now
}

// floorFor reads h's floor for a decision dated now. A live caller whose
// reading is older than the floor (it was preempted) re-reads the clock: it
// is then dated after the floor and pays nothing for it. A floor further
// ahead than MaxSkew is taken for a damaged word and ignored.
func (t *Table) floorFor(h uint64, now int64, live bool) (int64, int64) {
	floor := t.floorWord(h).Load()
	if floor > now && live {
		now = t.now()
	}
	if floor > now+repairSlack {
		floor = now
	}
	return floor, now
}

// testHookTakeOver, when set (by tests), is called in takeOver with the
// slot once it is locked (step 1) and once its TAT is replaced (step 2).
var testHookTakeOver func(s *slot, step int)

// testHookEvict, when set (by tests), is called with each evicted owner.
var testHookEvict func(owner uint64)

// floorWord returns the floor word of h (see claim).
func (t *Table) floorWord(h uint64) *atomic.Int64 {
	return (*atomic.Int64)(unsafe.Add(t.base, floorsOffset+(h>>55)%floorCount*8))
}

// raiseFloor raises h's floor word to at least v.
func (t *Table) raiseFloor(h uint64, v int64) {
	fw := t.floorWord(h)
	for {
		f := fw.Load()
		if f >= v || fw.CompareAndSwap(f, v) {
			return
		}
	}
}

// settle resolves a duplicate claim: two processes that insert h at the
// same instant can both miss it in the first pass and claim two slots. The
// slot earlier in the window wins: a claimer that finds h earlier gives its
// own slot back, one that finds h later takes that slot's key away. Whoever
// settles last sees the other, so the two converge on one slot. The loser's
// spends meanwhile are forgotten: looser, never tighter, and at most once.
func (t *Table) settle(h, home, pos uint64, s *slot) *slot {
	for i := range uint64(probeWindow) {
		if i == pos {
			continue
		}
		o := slotAt(t.slots, (home+i)&t.mask)
		// (Another incarnation of h that is losing its slot right now, its
		// key word locked, raised h's floor before the lock; claim carries
		// the floor over after settling.)
		if o.key.Load() != h {
			continue
		}
		t.duplicate(h)
		if i < pos {
			s.key.CompareAndSwap(h, 0)
			return o
		}
		o.key.CompareAndSwap(h, 0)
	}
	return s
}

// raiseTAT raises s's TAT to at least v.
func (t *Table) raiseTAT(s *slot, v int64) {
	for {
		tat := s.tat.Load()
		if tat >= v || s.tat.CompareAndSwap(tat, v) {
			return
		}
	}
}

// duplicate counts a duplicate slot given back.
func (t *Table) duplicate(h uint64) {
	t.rare.duplicates.Add(1)
	if testHookDuplicate != nil {
		testHookDuplicate(h)
	}
}

// testHookDuplicate, when set (by tests), is called with each key whose
// duplicate slot was given back.
var testHookDuplicate func(h uint64)

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
	if tat <= now {
		return 0
	}
	if d := tat - now; d <= t.tau+repairSlack {
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

func (t *Table) remaining(d int64) float64 {
	r := float64(t.tau-d) / float64(t.interval)
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
	return time.Duration(max(0, d+cost*t.interval-t.tau))
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

// Reset refills key's bucket to full, for every process: an operator lifting
// a limit by hand. It does nothing for an unknown or invalid key.
func (t *Table) Reset(key string) {
	if len(key) == 0 || len(key) > MaxKeyLen || t.closed.Load() {
		return
	}
	h := t.hk.hash(key)
	if s := t.find(h); s != nil {
		for {
			tat := s.tat.Load()
			if s.key.Load() != h || s.tat.CompareAndSwap(tat, 0) {
				return // moved on (a full bucket's slot), or refilled
			}
		}
	}
}

// Forget refills key's bucket and gives its slot back, for every process.
// It is never required (a full bucket's slot is reclaimed on demand) but
// frees the slot early when a key is known to be finished with.
func (t *Table) Forget(key string) {
	if len(key) == 0 || len(key) > MaxKeyLen || t.closed.Load() {
		return
	}
	h := t.hk.hash(key)
	home := h & t.mask
	for i := range uint64(probeWindow) {
		s := slotAt(t.slots, (home+i)&t.mask)
		if s.key.Load() == h {
			// Forgive first, then release: a key word of 0 with a leftover
			// debt is forgiven again by whoever claims the slot next.
			s.tat.Store(0)
			s.key.CompareAndSwap(h, 0)
		}
	}
}

// Slots returns the table's slot count (a power of two).
func (t *Table) Slots() int { return t.nslots }

// Path returns the file the table is mapped from.
func (t *Table) Path() string { return t.path }

// Policy returns the table's policy as its creator gave it, with Burst made
// explicit.
func (t *Table) Policy() Policy { return t.policy }

// Interval returns T, the time one token takes to come back.
func (t *Table) Interval() time.Duration { return time.Duration(t.interval) }

// Close unmaps the table. It is safe to call while other goroutines still
// use the Table: the shared mapping is replaced in place by private
// anonymous memory, so a call already past its closed check touches valid,
// unshared memory and cannot change the table. Every later call denies.
// Close is idempotent; the private replacement (untouched, so costing no
// memory) stays reserved in the address space until the process exits.
func (t *Table) Close() error {
	if !t.closed.CompareAndSwap(false, true) {
		return nil
	}
	if t.coarse != nil {
		t.coarse.stop()
	}
	return unmapShared(t.base, t.size)
}

func slotAt(slots unsafe.Pointer, i uint64) *slot {
	return (*slot)(unsafe.Add(slots, i*slotSize))
}
