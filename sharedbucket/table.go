package sharedbucket

import (
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
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

// repairSlack: a writer stores at most its own clock reading + τ, and a
// reading is at most a preemption old when it is used. So a TAT more than
// τ + repairSlack ahead of a fresh reading is a damaged word (or comes from a
// caller of an …At method whose clock is that far behind the others'): the
// allow path rewrites it to now+τ ("empty"), so a garbage word costs at most
// one bucket's worth of waiting instead of an arbitrary lockout.
const repairSlack = int64(time.Second)

// slot is one key's state in the shared mapping. Both words change only by
// atomic operations; see the package doc for their meaning.
type slot struct {
	key atomic.Uint64 // keyed hash of the key; 0 = empty
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
// cost below 1 or above the burst makes AllowN (and Bucket.TryAcquire)
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
	k0, k1     uint64         // hash key of this file
	failClosed bool
	coarse     *coarseClock // nil: read CLOCK_MONOTONIC on every call
	closed     atomic.Bool  // set once, by Close

	counts *counters     // per-P allowed/denied
	rare   *rareCounters // evicted, contended

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
	_         [64]byte
	evicted   atomic.Uint64
	contended atomic.Uint64
	_         [48]byte
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
		k0:         h.k0,
		k1:         h.k1,
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
	return t.decide(hashKey(t.k0, t.k1, key), cost, 0, true)
}

// AllowAt is AllowN with an explicit time: now is a CLOCK_MONOTONIC reading
// in nanoseconds (see Now), or any other clock all callers of this table
// share, in [0, 2^62). Callers must not pass times more than a second older
// than other callers' (a TAT further ahead than b·T + 1 s is taken for a
// damaged word and repaired). It returns false for a now outside that range.
func (t *Table) AllowAt(key string, cost, now int64) bool {
	if !t.validCall(key, cost) || !validNow(now) {
		return false
	}
	return t.decide(hashKey(t.k0, t.k1, key), cost, now, false)
}

// decide finds or claims h's slot and spends cost on it. With live set it
// reads the clock itself, once per call.
func (t *Table) decide(h uint64, cost, now int64, live bool) bool {
	if live {
		now = t.now()
	}
	s := t.slotFor(h, now)
	var ok bool
	if s == nil {
		ok = t.contended()
	} else {
		ok = t.spend(s, cost, now, live)
	}
	t.counts.add(ok)
	return ok
}

// contended records a call that gave up under contention and returns its
// answer: true (fail open) unless the handle fails closed.
func (t *Table) contended() bool {
	t.rare.contended.Add(1)
	return !t.failClosed
}

func (t *Table) validCall(key string, cost int64) bool {
	return len(key) != 0 && len(key) <= MaxKeyLen && cost >= 1 && cost <= t.burst && !t.closed.Load()
}

func validNow(now int64) bool { return now >= 0 && now < maxTau }

// spend is the GCRA step on one slot: allowed iff max(tat, now) + cost·T −
// now ≤ τ, and then one CAS stores max(tat, now) + cost·T. A denial writes
// nothing (except to repair a damaged word).
//
// Why the clock is read before the loop and not between Load and CAS: the
// bound b + (e−s)/T holds for any decision time the caller used, and a
// reading older than the TAT only makes the answer tighter. But a clock read
// (~20–40 ns) between Load and CAS is a window in which the other core takes
// the line back and wins every race: measured, two goroutines on one key then
// exhaust 1024 tries and fail open. Without it the window is a few ns. With
// refresh set (the live clock) a long retry sequence re-reads the clock.
func (t *Table) spend(s *slot, cost, now int64, refresh bool) bool {
	need := cost * t.interval
	for try := 1; ; try++ {
		tat := s.tat.Load()
		var d int64    // debt in ns; 0 means the bucket is full
		if tat > now { // compare first: tat − now cannot overflow then
			d = tat - now
		}
		if d > t.tau-need {
			if d > t.tau+repairSlack {
				t.repair(s, tat, now, refresh)
			}
			return false
		}
		if s.tat.CompareAndSwap(tat, now+d+need) {
			return true
		}
		if try == maxCASTries {
			return t.contended()
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
// now+τ (an empty bucket). With the live clock it first re-reads the clock,
// so a caller that slept between its reading and its load (SIGSTOP, a long
// preemption) cannot mistake a fresh TAT for a damaged one.
func (t *Table) repair(s *slot, tat, now int64, refresh bool) {
	if refresh {
		now = t.now()
		if tat-now <= t.tau+repairSlack {
			return
		}
	}
	s.tat.CompareAndSwap(tat, now+t.tau)
}

// slotFor returns h's slot, claiming one if h has none. It returns nil only
// when the claim loop gives up under contention.
func (t *Table) slotFor(h uint64, now int64) *slot {
	if s := t.find(h); s != nil {
		return s
	}
	return t.claim(h, now)
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

// claim gives h a slot in its probe window: the first empty one or the first
// whose bucket is full (a full bucket is no state at all, so the slot
// changes owner with one CAS on the key word and the TAT stays as it is).
// When every slot in the window holds a live bucket, it evicts the one
// nearest to full (smallest TAT): first it forgives that bucket's debt, then
// it takes the key word. A process killed between the two steps has only
// forgiven a debt, and the victim comes back to a full bucket: it can get
// more than its share, never less.
func (t *Table) claim(h uint64, now int64) *slot {
	home := h & t.mask
rounds:
	for range maxClaimRounds {
		var victim *slot
		var vkey, vpos uint64
		var vtat int64
		for i := range uint64(probeWindow) {
			s := slotAt(t.slots, (home+i)&t.mask)
			k := s.key.Load()
			if k == h {
				return s // claimed by someone else since our first pass
			}
			tat := s.tat.Load()
			if k == 0 || tat <= now {
				if !s.key.CompareAndSwap(k, h) {
					continue rounds // the slot changed; look again
				}
				if k == 0 && tat > now {
					// A slot given back (Forget, a lost duplicate) can
					// keep the debt of spends that raced with the give-back.
					// It belongs to nobody now; do not charge it to h.
					s.tat.CompareAndSwap(tat, 0)
				}
				return t.settle(h, home, i, s)
			}
			if victim == nil || tat < vtat {
				victim, vkey, vpos, vtat = s, k, i, tat
			}
		}
		if victim.tat.CompareAndSwap(vtat, 0) && victim.key.CompareAndSwap(vkey, h) {
			t.rare.evicted.Add(1)
			return t.settle(h, home, vpos, victim)
		}
	}
	return nil
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
		if o.key.Load() != h {
			continue
		}
		if i < pos {
			s.key.CompareAndSwap(h, 0)
			return o
		}
		o.key.CompareAndSwap(h, 0)
	}
	return s
}

// debt returns how far key's TAT is ahead of now (0 for a full or unknown
// bucket) and whether the key is valid. It writes nothing.
func (t *Table) debt(key string, now int64, live bool) (int64, bool) {
	if len(key) == 0 || len(key) > MaxKeyLen || t.closed.Load() {
		return 0, false
	}
	s := t.find(hashKey(t.k0, t.k1, key))
	if s == nil {
		return 0, true
	}
	return t.debtOf(s, now, live), true
}

func (t *Table) debtOf(s *slot, now int64, live bool) int64 {
	tat := s.tat.Load()
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
func (t *Table) Remaining(key string) float64 {
	d, ok := t.debt(key, 0, true)
	if !ok {
		return 0
	}
	return t.remaining(d)
}

// RemainingAt is Remaining at an explicit time (see AllowAt).
func (t *Table) RemainingAt(key string, now int64) float64 {
	if !validNow(now) {
		return 0
	}
	d, ok := t.debt(key, now, false)
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
	if cost < 1 || cost > t.burst {
		return Never
	}
	d, ok := t.debt(key, 0, true)
	if !ok {
		return Never
	}
	return t.retryAfter(d, cost)
}

// RetryAfterAt is RetryAfterN at an explicit time (see AllowAt).
func (t *Table) RetryAfterAt(key string, cost, now int64) time.Duration {
	if cost < 1 || cost > t.burst || !validNow(now) {
		return Never
	}
	d, ok := t.debt(key, now, false)
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
	if !validNow(now) {
		return 0
	}
	d, _ := t.debt(key, now, false)
	return time.Duration(d)
}

// Reset refills key's bucket to full, for every process: an operator lifting
// a limit by hand. It does nothing for an unknown or invalid key.
func (t *Table) Reset(key string) {
	if len(key) == 0 || len(key) > MaxKeyLen || t.closed.Load() {
		return
	}
	if s := t.find(hashKey(t.k0, t.k1, key)); s != nil {
		s.tat.Store(0)
	}
}

// Forget refills key's bucket and gives its slot back, for every process.
// It is never required (a full bucket's slot is reclaimed on demand) but
// frees the slot early when a key is known to be finished with.
func (t *Table) Forget(key string) {
	if len(key) == 0 || len(key) > MaxKeyLen || t.closed.Load() {
		return
	}
	h := hashKey(t.k0, t.k1, key)
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
	_, err := unix.MmapPtr(-1, 0, t.base, t.size, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED)
	return err
}
