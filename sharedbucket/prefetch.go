//go:build amd64 || arm64

package sharedbucket

import "unsafe"

// prefetch asks the CPU to start loading the cache line at p, and returns
// at once: it never faults and never waits for the line. Why assembly:
// Go offers no prefetch outside its runtime; the call, through the ABI
// wrapper every assembly function has, costs about a nanosecond.
//
//go:noescape
func prefetch(p unsafe.Pointer)
