// Package sharedbucket keeps one GCRA rate-limit bucket per key in a
// memory-mapped file, so that every process on a host that maps the file
// enforces the same limit per key.
//
//	tb, err := sharedbucket.Open(filepath.Join(sharedbucket.DefaultDir(), "api.sbt"),
//		sharedbucket.Policy{Limit: 100, Window: time.Minute}) // every process opening the file shares it
//	if err != nil { ... }
//	defer tb.Close()
//	if !tb.Allow(clientIP) {
//		retry := tb.RetryAfter(clientIP) // how long until the key has a token
//		...
//	}
//
// Table.Bucket(key) is one key's handle, for a hot key; a Bucket also feeds
// a blocking, FIFO ratelimiter.Limiter (ratelimiter.Shared). Linux and
// macOS; elsewhere Open returns an error matching errors.ErrUnsupported.
//
// A check costs one clock read (the host's monotonic clock through the
// vDSO, see [Now]; or an atomic load with [WithCoarseClock]), a keyed hash, a
// load and, when the request is allowed, one compare-and-swap on a word of
// shared memory. There is no lock, no syscall and no write that every
// process shares: a denial writes nothing at all.
//
// Time: a table decides without waiting, on readings of the host's
// monotonic clock in nanoseconds ([Now]: one int64, the same in every
// process). X and XN read it; XAt takes the reading, for tests that drive
// time by hand. There is no context clock and no clock.Clock option: a
// reading must mean the same instant in every process sharing the file.
//
// # Calls
//
// [Table] and [Bucket] (one key's handle) share one naming grid, as
// golang.org/x/time/rate does: X is one token now, XN is n tokens now, XAt
// is n tokens at an explicit time (a [Now] reading).
//
//   - Allow, AllowN, AllowAt: the decision.
//   - Decide, DecideN, DecideAt: the decision with its figures (remaining,
//     retry-after, reset-after) from the same read and CAS, in a [Decision]:
//     what a service puts in its headers, at the cost of one decision.
//   - Remaining, RetryAfter, ResetAfter (…N, …At): read-only figures.
//
// # Model
//
// A [Policy] of Limit per Window with burst b gives the emission interval
// T = ceil(Window/Limit) nanoseconds per token and the bucket depth τ = b·T.
// Each key holds one int64 "theoretical arrival time" (TAT). A request of
// cost c at time now is allowed iff
//
//	max(tat, now) + c·T − now ≤ τ
//
// and, when allowed, stores the left-hand side's max(tat, now) + c·T as the
// new TAT. A bucket is full exactly when tat ≤ now, so a full bucket needs no
// state at all and its slot is free for another key.
//
// For any interval [s, e] and one key, the costs allowed with decision times
// in [s, e], summed over every process, never exceed b + (e−s)/T. There is no
// slack in that bound. It holds for every interleaving of live calls
// (including a caller preempted between its clock read and its probe while
// its key's slot changed hands), for …At calls whose times lie within
// [MaxSkew] of one another, and whichever processes are killed or stopped
// at whatever instruction. The only events that loosen it are these, each
// counted in [Stats] by the process that meets it, and each worth at most
// one burst (a full bucket) to one key:
//
//   - an eviction (Stats.Evicted): more keys live at once than a probe
//     window holds; the evicted key starts over with a full bucket;
//   - a call given up under contention (Stats.Contended), allowed unless
//     the handle was opened with [WithFailMode] of store.FailClosed (that
//     one call);
//   - a lock taken over (Stats.Recovered): a process killed or stopped while
//     it moves a slot to a new key leaves the slot locked; once the lock is
//     [LockTimeout] old, or its process is gone, or a claim has waited on it
//     for LockTimeout, that claim takes it over, and the key the slot was
//     leaving may start over with a full bucket;
//   - damage: a word of the file changed other than by this package (see
//     Files), found impossible and reset (Stats.Corrupt) or not;
//   - …At times further apart than MaxSkew, which look like damaged words
//     and are repaired to empty buckets (Stats.Corrupt; tighter, not looser);
//   - [Table.Reset] and [Table.Forget], which are explicit and not counted.
//
// No slot stays locked longer than LockTimeout after its holder stops:
// every claim that looks at an older lock, and every Stats call, takes it
// over. Nothing corrupt or abandoned makes a key unlimited, nor shuts it
// out for good.
//
// A key never has two buckets (short of damage, see Files). The first
// requests for a new key from several processes at once race to claim it a
// slot, and a claimer may be descheduled or stopped in the middle of its
// claim; two buckets for one key would each allow a burst at the same
// instant, which nothing can take back. So a claim never publishes a key
// while another claim that may be for the same key is under way in the key's
// probe window (a lock word does not say which key its claim is for): it
// waits until the window holds no lock before it locks its slot, and once it
// holds its lock it looks through the window again, giving its slot back if
// the key is published elsewhere (counted in Stats.Duplicates) or another
// claim holds an earlier slot. A racing claim therefore costs nothing
// against the bound. It costs time: a call that claims waits for the claims
// under way in its key's window, a few CASes, or, behind a process stopped
// or descheduled mid-claim, until that process is gone, its lock is
// LockTimeout old, or the call has waited LockTimeout (then it takes the
// lock over, see above). A window whose every slot is locked is not waited
// on: its call gives up after a few rounds of yielding, per WithFailMode
// (Stats.Contended), as does one that has waited 2·LockTimeout because new
// claims kept locking slots of its window.
//
// One corner remains, for …At calls only: two claims of one process dated
// alike (on a clock that stands still, as a test's may) carry the same lock
// word, so a claim stopped for LockTimeout mid-claim, whose lock was taken
// over, can wake while a later claim holds the same word and publish its
// key without looking again: a second bucket. Live calls stamp their locks
// with a clock reading taken as they lock, and never meet it.
//
// # Slots
//
// A table has a power-of-two number of 16-byte slots, {key word, TAT}. A key
// lives in the first slot of its 8-slot probe window whose key word holds its
// hash: a multiply-fold hash keyed by a random 128-bit key stored in the
// file, cut to 63 bits, so nobody who cannot read the file can choose keys
// that collide in one window (two 64-bit multiplies for a key of up to 16
// bytes; SipHash-1-3 until format version 3). It is a defence against
// hash flooding of the strength Go's own maps have where AES instructions
// are missing, not a cryptographic PRF: without the file's key nobody can
// compute colliding keys, but one who can watch evictions for long enough
// learns more about that key than SipHash would have let them (the price
// of a hash that costs a third of SipHash-1-3, see BenchmarkHash). A
// lookup scans the whole window before anything is claimed. A new key
// takes an empty slot, else
// the slot whose bucket has been full the longest, else (every bucket in
// the window is live) it evicts the bucket nearest to full: more than its
// share for the victim, never less.
//
// Moving a slot to a new key is a short protocol of single-word CASes: the
// old owner's floor is raised, the key word is locked (its top bit set, with
// the claim's time and process id in the other bits), the window is looked
// through again for the key and for other claims (see above), the TAT is
// replaced with a value no earlier reader holds, and the new key is
// published. A
// spend reads the TAT, then checks the key word, then CASes the TAT, so it
// lands on its own key's bucket or not at all. A lock whose holder died or
// stopped is taken over once it is LockTimeout old (or, by a claim that
// waited on it, as soon as its process no longer exists, or once that
// claim has waited LockTimeout); a holder that
// wakes after that writes nothing more to the slot, since each of its
// remaining writes is a CAS that the take-over makes fail.
//
// Each key's hash picks one of 256 floor words in the file's first page:
// the latest time at which a bucket of a key in that group was full and
// lost its slot. A new bucket starts full at its claim's time (a fresh
// clock reading for a live caller), or at its key's floor if that is
// later, so a decision dated before either (a caller held up since its
// clock read, a stale …At time) sees the debt the key could still have
// rather than a fresh bucket.
//
// # Files
//
// [Open] creates a table file or attaches to an existing one. The creator
// builds the file under a temporary name and publishes it with link(2), so
// the final name only ever names a complete file; racing creators all
// succeed and agree on one file, and a creator killed half-way leaves only
// a temporary file that the next opener removes. Every block is allocated
// before a file is mapped (a sparse file is allocated or refused with
// [ErrCorrupt]: on a full filesystem, touching a hole would be a SIGBUS).
// An existing file is never truncated or reinitialised, except that a file
// written before the last reboot (its clock readings mean nothing now) is
// replaced under a lock. A file with another policy or slot count is
// refused with [ErrPolicyMismatch], a damaged one with [ErrCorrupt]. A
// directory that group or others may write without the sticky bit is
// refused. [NewArena] keeps named tables, one file each, in one directory;
// [DefaultDir] is the default place (a tmpfs directory private to the user
// where there is one).
//
// Who may write a table file: every process that can open it for writing
// (its owner's; a group's too with [WithMode]). Each of them can set any
// bucket to anything, so each is trusted as far as the limits are. What a
// write outside this package's protocol (a bug, a stray write, a flipped
// bit) can do is bounded: a damaged word forgives at most one key's bucket
// once (b tokens; to a decision held up across the damage, also the time
// it was held up, a token per T) or delays one key by at most b·T +
// MaxSkew. A word no process could have written (a TAT beyond now + b·T +
// MaxSkew, a lock dated beyond MaxSkew ahead or without a process id, a key
// outside its probe window) is reset by the next call that meets it and
// counted in Stats.Corrupt; the bound holds again from the next call. A
// damaged header is refused at Open; a header changed later changes
// nothing, since each process keeps its own copy.
//
// # Upgrades
//
// The file format has a version (4 since lock words carry a time; 3 since
// the key hash changed). A process refuses a file of another version with
// [ErrVersion], naming both versions and what to do, rather than share it:
// two versions that hash keys or lock slots differently would split a key's
// limit, or wait on each other's locks. So an old and a new binary never
// share a table file: whichever finds a file made by the other fails at
// Open. To upgrade, stop every process using the tables,
// remove their files (an Arena's are dir/*.sbt, see [TableExt]; every bucket
// starts full again), and start them all on the new version.
//
// All processes that share a table must run on the same host and in the same
// time namespace (they must agree on the monotonic clock). Truncating or
// deleting a table file while processes have it mapped is not supported: a
// process touching a truncated mapping receives SIGBUS and crashes.
//
// # Platforms
//
// Linux (CLOCK_MONOTONIC, boot id from /proc) and macOS (mach_absolute_time,
// boot identity from kern.boottime; files allocated by writing zeros). The
// package builds everywhere; elsewhere Open and NewArena return an error
// wrapping errors.ErrUnsupported.
package sharedbucket
