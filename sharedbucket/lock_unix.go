//go:build linux || darwin

package sharedbucket

import "golang.org/x/sys/unix"

// holderGone reports whether the process that took lock w has certainly
// exited: kill(pid, 0) fails with ESRCH. A pid reused by another process
// reads as alive (the lock then waits for LockTimeout); a holder in another
// pid namespace may read as gone, which only takes its lock over early
// (safe, see Table.unlock).
func holderGone(w uint64) bool {
	pid := int(w & pidMask)
	return pid > 0 && unix.Kill(pid, 0) == unix.ESRCH
}
