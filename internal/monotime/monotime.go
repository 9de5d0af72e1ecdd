// Package monotime reads the host's monotonic clock the way the Go runtime
// does, for the hot paths that read it once per decision: the limiter's fast
// path, the memory store and the shared-memory table.
//
// Why not time.Since: Go 1.26's time.Since first asks the runtime whether
// the caller is inside a testing/synctest bubble (a call of its own), then
// reads the clock (another). A limiter or store knows which it is when it is
// made, so it asks once (Bubbled) and then reads the clock alone, one call
// fewer on every Acquire.
package monotime

import (
	"time"
	_ "unsafe" // for go:linkname
)

// Now returns the runtime's monotonic clock in nanoseconds: on Linux
// CLOCK_MONOTONIC through the vDSO, on macOS mach_absolute_time (ticks since
// boot, scaled to ns), on Windows the interrupt time. On Linux and macOS it
// is an absolute reading every process on the host (in one time namespace)
// agrees on, which is what the shared-memory table needs. Inside a synctest
// bubble it is still real time.
//
// Why the linkname: time.Now's monotonic part is relative to the process's
// start, so it cannot be compared across processes, and unix.ClockGettime is
// a system call, where the runtime reads the clock through the vDSO. The runtime keeps nanotime linkable
// on purpose ("Do not remove or change the type signature",
// go.dev/issue/67401).
//
//go:linkname Now runtime.nanotime
func Now() int64

// Bubbled reports whether the caller runs inside a testing/synctest bubble,
// where time is the bubble's fake time and Now must not be used for it. A
// bubble's readings of time.Now carry no monotonic part (the runtime omits
// it there), and every other reading of time.Now carries one.
func Bubbled() bool {
	t := time.Now()
	return t == t.Round(0) // Round(0) strips the monotonic part and nothing else
}
