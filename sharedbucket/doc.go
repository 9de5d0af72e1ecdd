// Package sharedbucket keeps one GCRA rate-limit bucket per key in a
// memory-mapped file, so that every process on a host that maps the file
// enforces the same limit per key.
//
// A check costs one clock read (the host's monotonic clock through the
// vDSO, see [Now]; or an atomic load with [WithCoarseClock]), a keyed hash, a
// load and, when the request is allowed, one compare-and-swap on a word of
// shared memory. There is no lock, no syscall and no write that every
// process shares: a denial writes nothing at all.
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
// its key's slot changed hands) and for …At calls whose times lie within
// [MaxSkew] of one another. The only events that loosen it are:
//
//   - an eviction (counted in [Stats].Evicted): more keys live at once than
//     a probe window holds; the evicted key starts over with a full bucket;
//   - a call given up under contention (Stats.Contended), allowed unless
//     the handle was opened with [FailClosed];
//   - a duplicate claim (Stats.Duplicates): the first requests for a new key
//     from two processes at once, when one of them is held up mid-claim,
//     can give the key two slots for a moment; spends on the one given back
//     are forgotten, once;
//   - [Table.Reset] and [Table.Forget], which are explicit;
//   - a process killed in the middle of moving a slot to a new key (a few
//     instructions): at most that slot's old owner's in-flight spend;
//   - …At times further apart than MaxSkew, which look like damaged words
//     and are repaired.
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
// old owner's floor is raised, the key word is locked (its top bit), the TAT
// is replaced with a value no earlier reader holds, and the new key is
// published. A spend reads the TAT, then checks the key word, then CASes the
// TAT, so it lands on its own key's bucket or not at all. Each key's hash
// picks one of 256 floor words in the file's first page: the latest time at
// which a bucket of a key in that group was full and lost its slot. A new
// bucket starts at its key's floor, so a decision dated before the floor
// (a stale …At time; a live caller re-reads the clock instead) sees the debt
// the lost bucket could still have had rather than a fresh bucket.
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
// # Upgrades
//
// The file format has a version (3 since the key hash changed).
// A process refuses a file of another version with ErrCorrupt naming both
// versions, rather than share it: two versions that hash keys differently
// would each keep their own bucket for a key and split its limit. So an old
// and a new binary never share a table file: whichever finds a file made by
// the other fails at Open. To upgrade, stop every process using the tables,
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
