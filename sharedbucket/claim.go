package sharedbucket

import (
	"runtime"
	"sync/atomic"
	"unsafe"
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
	if testHookTakeOver != nil {
		testHookTakeOver(s, 0)
	}
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
