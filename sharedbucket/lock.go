package sharedbucket

import (
	"os"
	"time"
)

// LockTimeout bounds how long a slot stays locked after the process that
// locked it stops. A claim locks a slot's key word for the few CASes that
// move the slot to a new key (see Table.takeOver); a process killed or
// stopped in between leaves the lock behind. A lock LockTimeout old is
// taken over by the next claim that looks at it, or by Stats (counted in
// Stats.Recovered), and one no process could have written (a time ahead of
// every caller's clock, or no process id) at once (counted in
// Stats.Corrupt). A claim waits on a younger lock in its key's probe window
// (it may be a claim of the same key; see the package doc) and takes it
// over when its process no longer exists, or once it has waited on it for
// LockTimeout.
//
// Why 100 ms: a live holder keeps its lock for well under a microsecond
// unless it is descheduled, so a lock this old almost always belongs to a
// dead or stopped process; and until then claims in its window wait, and a
// probe window whose every slot is locked answers new keys per WithFailMode
// (open by default), so the bound should be short. Taking a lock over from
// a holder that is merely slow is safe (see Table.unlock), so erring short
// costs nothing but a count.
const LockTimeout = 100 * time.Millisecond

// A key word with lockBit set is a lock. Its other 63 bits say when and by
// whom it was taken:
//
//	bits 22..62  the locker's decision time (the table's clock), in units of
//	             lockUnit (2^21 ns, about 2.1 ms), rounded down
//	bits 0..21   the locker's process id (Linux pids are below 2^22, macOS's
//	             below 100,000); never 0
//
// Why a time and not the old owner's hash (format version 3): only a time
// lets anyone tell a lock whose holder died from one at work. The old owner
// needs no name in the lock: its floor is raised before the lock is taken,
// so a new bucket for it starts where the lost one could still have been.
const (
	pidBits      = 22
	pidMask      = 1<<pidBits - 1
	lockShift    = 21
	lockUnit     = int64(1) << lockShift
	lockTimeMask = 1<<(63-pidBits) - 1
)

// lockPID is this process's id as a lock word carries it (never 0: a pid
// that does not fit would read as pid 0, which no lock may carry, so it
// becomes 1, init's, which never looks gone).
var lockPID = func() uint64 {
	if p := uint64(os.Getpid()); p != 0 && p <= pidMask {
		return p
	}
	return 1
}()

// lockWord returns the lock word of a claim at time now (0 ≤ now < 2^62):
// a fresh clock reading for a live caller, else its explicit time.
func lockWord(now int64) uint64 {
	return lockBit | (uint64(now>>lockShift)&lockTimeMask)<<pidBits | lockPID
}

// lockTime returns when w was taken, rounded down to lockUnit.
func lockTime(w uint64) int64 { return int64(w>>pidBits&lockTimeMask) << lockShift }

// What a claimer makes of a lock.
const (
	lockHeld    = iota // younger than LockTimeout: its holder may be at work
	lockStale          // LockTimeout old: its holder died or is stopped
	lockInvalid        // no locker could have written it
)

// lockState judges lock word w at time now. A lock dated more than MaxSkew
// ahead of now cannot have been taken yet (a caller's time lies at most
// MaxSkew behind the newest; see Table.AllowAt).
func lockState(w uint64, now int64) int {
	at := lockTime(w)
	switch {
	case w&pidMask == 0 || at > now+repairSlack:
		return lockInvalid
	case now-at >= int64(LockTimeout):
		return lockStale
	}
	return lockHeld
}

// judgeLock is lockState for a claim dated now; a live caller re-reads the
// clock (not the coarse one: locks are stamped with fresh readings) before
// calling a lock invalid, as it may have slept since its reading.
func (t *Table) judgeLock(w uint64, now int64, live bool) int {
	st := lockState(w, now)
	if st == lockInvalid && live {
		st = lockState(w, nanotime())
	}
	return st
}

// unlock takes lock w off slot s, leaving the slot empty, and counts it
// (Corrupt for an invalid lock, Recovered otherwise). It reports false when
// the key word no longer holds w.
//
// Why emptying the slot is safe whatever its holder did, and even if the
// holder is alive and wakes up later:
//
//   - The holder raised the old owner's floor before it locked, so the old
//     owner's next bucket starts where the lost one could still have been
//     (a reclaim loses nothing). What the TAT word still holds is replaced
//     by the next claim of the empty slot, as after Forget. The one loss:
//     an old owner that spent between the holder's look and its lock (a
//     reclaim the holder would have abandoned) loses that debt, at most one
//     burst, counted here.
//   - Everything a holder writes after its lock is conditional on the key
//     word still holding its lock word: its TAT write is a CAS against a
//     TAT it read after checking the key word, and whoever claims the slot
//     next replaces the TAT with a different value before publishing, so
//     that CAS fails; its publish is a CAS from its lock word, which does
//     not come back: a later lock of this slot carries another process's id
//     or a later time (a live claim stamps its lock with a clock reading
//     taken after it saw the slot free, so at least LockTimeout after the
//     stale lock's). So a stalled holder that wakes cannot touch the slot:
//     its claim fails and it claims again elsewhere. (A word can repeat
//     within one process only through explicit times: claims dated more
//     than LockTimeout apart, or dated alike on a clock that stands still
//     while a claim waits LockTimeout on a stalled holder and takes its
//     lock over. If that holder wakes while a later claim holds the same
//     word, its CASes can land: it still starts its key at its floor and
//     the other claims again, but it publishes without its second look
//     through the window, so its key may get a second bucket. A table used
//     only by live calls never repeats a word: each lock carries a reading
//     taken after the slot was seen free, LockTimeout after the stale
//     lock's.)
//   - An old owner's spend that read the TAT before the lock lands, as
//     ever, on a TAT that no other key's bucket holds, or not at all.
func (t *Table) unlock(s *slot, w uint64, state int) bool {
	if !s.key.CompareAndSwap(w, 0) {
		return false
	}
	if state == lockInvalid {
		t.rare.corrupt.Add(1)
	} else {
		t.rare.recovered.Add(1)
	}
	return true
}
