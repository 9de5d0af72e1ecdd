package sharedbucket

import (
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/sluice-go/sluice/internal/gcra"
)

// lockBit marks a key word whose slot is changing owner (see takeOver); the
// other 63 bits say when and by which process (see lockWord). Hashes never
// have it set.
const lockBit = uint64(1) << 63

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
//
// One key, one slot: two claims of h that both publish it would give h two
// buckets, each seeing only the spends made on it: up to two bursts at one
// instant, which nothing done afterwards can take back (the tokens are
// spent). A lock word does not say which key its claim is for, so a claim
// takes every claim under way in h's window for a claim of h:
//
//   - before locking a slot it waits until no slot of the window is locked
//     (see lockWait: a few CASes, or, behind a stopped claimer, until that
//     claimer's process is gone or its lock has been watched LockTimeout);
//   - once it holds its lock it looks through the window again (see
//     takeOver and rival) and publishes h only if no other slot holds h
//     nor a lock.
//
// Two claims that lock at the same time both look after locking, so the
// later look sees the other's lock (or its key): they cannot both publish.
func (t *Table) claim(h uint64, now int64, live bool) (*slot, int64) {
	home := h & t.mask
	var w lockWait
	for tries := 0; tries < maxClaimRounds; {
		var pick *slot
		var pk uint64
		var ptat int64
		kind := takeEvict + 1
		held := false
		for i := range uint64(probeWindow) {
			j := (home + i) & t.mask
			s := slotAt(t.slots, j)
			k := s.key.Load()
			if k&lockBit != 0 || k != 0 && !t.inWindow(k, j) {
				if !t.clearSlot(s, k, now, live, &w, i) {
					held = true // another claim is under way here
					continue
				}
				k = 0
			}
			switch {
			case k == h:
				return s, now // claimed by someone else since our first pass
			case k == 0:
				if kind > takeEmpty {
					pick, pk, kind = s, k, takeEmpty
				}
			default:
				tat := s.tat.Load()
				if t.damaged(gcra.Debt(tat, now)) {
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
					pick, pk, ptat, kind = s, k, tat, c
				}
			}
		}
		switch {
		case pick == nil:
			// Every slot is locked: nothing to claim. That is a burst of
			// claims that ends in a few CASes, or claimers that stopped;
			// after maxClaimRounds the call gives up (WithFailMode says how
			// it answers) rather than hold its caller until LockTimeout.
			tries++
			w.spin()
			continue
		case held:
			// The claim under way may be for h (see above).
			if !w.pause() {
				return nil, now
			}
			continue
		}
		r, s, n := t.takeOver(pick, pk, h, home, now, live, kind, &w)
		now = n
		switch r {
		case claimed:
			// An incarnation of h that lived and lost its slot entirely
			// while we claimed ours raised h's floor after we read it:
			// carry it over.
			t.raiseTAT(s, t.floorWord(h).Load())
			return s, now
		case claimFound:
			t.duplicate(h)
			return s, now
		case claimWait:
			if !w.pause() {
				return nil, now
			}
		case claimGiveUp:
			return nil, now
		default: // claimLost
			tries++
		}
	}
	return nil, now
}

// lockWait is one claim's wait for the other claims under way in its key's
// probe window (see claim). The zero value is ready to use.
type lockWait struct {
	rounds int                 // pauses so far
	slept  int64               // nanotime of the first sleep; 0 before
	word   [probeWindow]uint64 // the lock word last seen at each window position
	since  [probeWindow]int64  // nanotime when it was first seen there
}

// spinRounds is how many times a waiting claim yields before it sleeps and
// asks whether a lock's process is gone.
const spinRounds = maxClaimRounds / 2

// lockWatch is how long a claim watches one lock word before it takes the
// lock over: LockTimeout (a variable for tests only).
var lockWatch = LockTimeout

// given reports whether the claim may stop waiting for lock word k at
// window position i and take the lock over: this claim has watched it for
// lockWatch (its holder is stopped or dead; taking over a merely slow
// holder is safe, see unlock), or, once the claim has spun, its process is
// gone (asked now and then: a syscall).
//
// Why watch in real time and not only judge the lock's own time: a table
// driven by …At calls may run on a clock that does not move while a caller
// waits; waiting must end anyway.
func (w *lockWait) given(i, k uint64) bool {
	now := nanotime()
	if w.word[i] != k {
		w.word[i], w.since[i] = k, now
	}
	if now-w.since[i] >= int64(lockWatch) {
		return true
	}
	return w.rounds >= spinRounds && (w.rounds-spinRounds)%4 == 0 && holderGone(k)
}

// spin yields once: the wait of a claim whose window has no slot free.
func (w *lockWait) spin() {
	w.rounds++
	runtime.Gosched()
}

// pause waits before the claim looks again: it yields for spinRounds rounds
// (a claim under way holds its lock for a few CASes), then sleeps, from
// 10µs growing to 1ms (its holder is descheduled or stopped: spinning would
// keep a core from it). It reports false once the claim has slept for
// 2·lockWatch: every lock it watched that long was taken over, so new
// claims keep locking slots of the window; the call then gives up as under
// contention.
func (w *lockWait) pause() bool {
	w.rounds++
	if w.rounds <= spinRounds {
		runtime.Gosched()
		return true
	}
	now := nanotime()
	if w.slept == 0 {
		w.slept = now
	} else if now-w.slept > 2*int64(lockWatch) {
		return false
	}
	time.Sleep(min(10*time.Microsecond<<min(w.rounds-spinRounds-1, 7), time.Millisecond))
	return true
}

// inWindow reports whether slot j lies in the probe window of key word k:
// no claim puts a key anywhere else, so a key word outside is damage.
func (t *Table) inWindow(k, j uint64) bool { return (j-k)&t.mask < probeWindow }

// clearSlot empties slot s, at position i of the window being claimed in,
// whose key word k is a lock or a key outside its probe window, if it may
// (see unlock): a key outside its window, or an invalid lock, at once
// (counted in Corrupt); a lock LockTimeout old by its own time, or one w
// is done waiting for (see lockWait.given), counted in Recovered. It
// reports whether the slot is now empty of k.
func (t *Table) clearSlot(s *slot, k uint64, now int64, live bool, w *lockWait, i uint64) bool {
	st := lockInvalid
	if k&lockBit != 0 {
		st = t.judgeLock(k, now, live)
		if st == lockHeld && w.given(i, k) {
			st = lockStale
		}
	}
	return st != lockHeld && t.unlock(s, k, st)
}

// Results of takeOver.
const (
	claimed     = iota // the slot now holds h
	claimFound         // h was published in another slot meanwhile: use that one
	claimLost          // the slot changed under us: look again
	claimWait          // a claim under way holds an earlier slot: we gave way
	claimGiveUp        // waited too long (see lockWait.pause)
)

// takeOver moves slot s (in h's window, which starts at home) from key word
// k to h, and returns the slot to use when h ends up in one. Every step is
// one CAS, in an order that keeps every other party's view safe:
//
//  1. raise the old owner's floor to now (before anyone can miss it);
//  2. lock the key word (k → a lock word with this claim's time and
//     process id): the old owner's spends now fail their key check, and
//     other claimers wait for the slot (see claim);
//  3. look through h's window for another slot holding h or a lock (see
//     rival). If one holds h, or a lock at an earlier slot (by index in the
//     table), give s back as it was (k restored; its TAT is untouched) and
//     use h's slot, or wait for the lock. If only later slots are locked,
//     wait for them, holding s, and look again;
//  4. read h's floor (only now: any earlier incarnation of h that has lost
//     its slot raised it before its slot was locked) and replace the TAT
//     with h's starting value: a bucket full at the claim's time, or at the
//     floor if that is later. It differs from (for a reclaim: exceeds) the
//     TAT read, so no spend by the old owner that read that TAT earlier can
//     land afterwards. A reclaim whose bucket turned live again meanwhile is
//     abandoned and the key word restored;
//  5. publish h in the key word.
//
// Why step 3 orders by slot: two claims that lock at once may each see the
// other's lock. The one at the later slot gives way; the one at the earlier
// slot waits for the later one to give way, or to publish (had it looked
// before our lock, it saw nothing of ours): then we see its key, if it is
// h, and give way in turn. A claim waits holding its lock only for locks
// at later slots, so no chain of waits goes round in a circle, and each
// wait ends within lockWatch (see lockWait.given).
//
// Why the bucket starts at the claim's time (a fresh reading for a live
// caller) and not at the floor alone: a bucket full since some earlier time
// would serve a decision dated before the bucket existed (a caller of h
// held up between its clock read and its spend, or an …At time a little
// behind) with a full burst, on top of what h's previous bucket gave for
// that time. Started at the claim's time, such a decision sees the debt
// of a bucket that filled up only by then.
//
// A process killed or stopped between 2 and 5 leaves the slot locked; the
// next claim takes the lock over once it is LockTimeout old, or its process
// is gone, or it has watched it for LockTimeout (see unlock for why that is
// safe even if the holder wakes).
func (t *Table) takeOver(s *slot, k, h, home uint64, now int64, live bool, kind int, w *lockWait) (int, *slot, int64) {
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
	if testHookTakeOver != nil {
		testHookTakeOver(s, 0)
	}
	if !s.key.CompareAndSwap(k, lock) {
		return claimLost, nil, now
	}
	if testHookTakeOver != nil {
		testHookTakeOver(s, 1)
	}
	for {
		r, o := t.rival(h, home, s, now, live, w)
		if r == rivalNone {
			break
		}
		if r == rivalAfter && s.key.Load() == lock {
			if w.pause() {
				continue
			}
			r = -1 // waited too long
		}
		// Give s back as it was. (A failed CAS: our lock was taken over
		// meanwhile, and the slot is someone else's.)
		s.key.CompareAndSwap(lock, k)
		switch r {
		case rivalFound:
			return claimFound, o, now
		case rivalBefore:
			return claimWait, nil, now
		case -1:
			return claimGiveUp, nil, now
		}
		return claimLost, nil, now
	}
	var floor int64
	floor, now = t.floorFor(h, now, live)
	for {
		w := s.tat.Load()
		if s.key.Load() != lock {
			return claimLost, nil, now // taken over as stale (see unlock)
		}
		init := max(floor, now)
		switch {
		case kind == takeReclaim && w > now:
			// The owner spent since we looked: its bucket is live again.
			s.key.CompareAndSwap(lock, k)
			return claimLost, nil, now
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
	if !s.key.CompareAndSwap(lock, h) {
		return claimLost, nil, now
	}
	return claimed, s, now
}

// Results of rival.
const (
	rivalNone   = iota
	rivalFound  // another slot holds h
	rivalBefore // a claim under way holds a slot before s in the table
	rivalAfter  // claims under way hold only slots after s
)

// rival looks through h's window (starting at home), other than s, which
// this claim has locked: for h (rivalFound, and its slot), else for claims
// under way, which may be h's (see takeOver). Locks it may take over and
// keys outside their window it clears on the way, as claim does.
func (t *Table) rival(h, home uint64, s *slot, now int64, live bool, w *lockWait) (int, *slot) {
	r := rivalNone
	for i := range uint64(probeWindow) {
		j := (home + i) & t.mask
		o := slotAt(t.slots, j)
		if o == s {
			continue
		}
		k := o.key.Load()
		switch {
		case k == h:
			return rivalFound, o
		case k&lockBit == 0 && (k == 0 || t.inWindow(k, j)):
			// a key's bucket, or empty
		case t.clearSlot(o, k, now, live, w, i):
		case uintptr(unsafe.Pointer(o)) < uintptr(unsafe.Pointer(s)):
			r = rivalBefore // slots lie in one array: address order is index order
		case r == rivalNone:
			r = rivalAfter
		}
	}
	return r, nil
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
// slot just before it is locked (step 0), once it is locked (step 1) and
// once its TAT is replaced (step 2).
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

// raiseTAT raises s's TAT to at least v.
func (t *Table) raiseTAT(s *slot, v int64) {
	for {
		tat := s.tat.Load()
		if tat >= v || s.tat.CompareAndSwap(tat, v) {
			return
		}
	}
}

// duplicate counts a claim that gave its slot back because a racing claim
// had published h (see takeOver).
func (t *Table) duplicate(h uint64) {
	t.rare.duplicates.Add(1)
	if testHookDuplicate != nil {
		testHookDuplicate(h)
	}
}

// testHookDuplicate, when set (by tests), is called with each key a claim
// found published by a racing claim.
var testHookDuplicate func(h uint64)
