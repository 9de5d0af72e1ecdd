// Package sharedbucket keeps one GCRA rate-limit bucket per key in a
// memory-mapped file, so that every process on a host that maps the file
// enforces the same limit per key.
//
// A check costs one clock read (CLOCK_MONOTONIC through the vDSO, see [Now];
// or an atomic load with [WithCoarseClock]), a keyed hash, a load and, when
// the request is allowed, one compare-and-swap on a word of shared memory.
// There is no lock, no syscall and no write that every process shares: a
// denial writes nothing at all.
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
// slack in that bound; the only events that loosen it are the ones counted
// in [Stats] (Evicted, Contended), explicit [Table.Reset]/[Table.Forget],
// and the rare duplicate claim described under Slots.
//
// # Slots
//
// A table has a power-of-two number of 16-byte slots, {key hash, TAT}. A key
// lives in the first slot of its 8-slot probe window that holds its hash
// (SipHash-1-3 under a random key stored in the file, so nobody can choose
// colliding keys). A lookup scans the whole window before anything is
// claimed; a new key takes the first empty slot or the first whose bucket is
// full, with one CAS on the key word; when the whole window is live it
// evicts the bucket nearest to full, forgiving its debt first, so the victim
// comes back to a full bucket: more than its share, never less.
//
// What one 8-byte CAS cannot make atomic is documented rather than hidden:
// two processes inserting the same new key at the same instant can both
// claim a slot (the later one in the window gives its slot back; spends on
// it in between are forgotten, once), and a spend by a key whose full bucket
// is being reclaimed at that instant lands on the new owner (at most one
// in-flight spend per process).
//
// # Files
//
// [Open] creates a table file or attaches to an existing one. The creator
// builds the file under a temporary name and publishes it with link(2), so
// the final name only ever names a complete file and a creator killed
// half-way leaves nothing that blocks anyone. An existing file is never
// truncated or reinitialised, except that a file written before the last
// reboot (its CLOCK_MONOTONIC readings mean nothing now) is replaced under a
// lock. A file with another policy or slot count is refused with
// [ErrPolicyMismatch], a damaged one with [ErrCorrupt]. [NewArena] keeps
// named tables, one file each, in one directory; [DefaultDir] is the default
// place (a tmpfs directory private to the user).
//
// All processes that share a table must run on the same host and in the same
// time namespace (they must agree on CLOCK_MONOTONIC). Truncating or deleting
// a table file while processes have it mapped is not supported: a process
// touching a truncated mapping receives SIGBUS and crashes.
//
// The package supports Linux.
package sharedbucket
