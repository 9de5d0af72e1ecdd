//go:build unix

package bench_test

import (
	"syscall"
	"time"
)

// cpuTime returns the CPU time (user + system) this process has used. On a
// loaded machine a benchmark's wall time counts the time other processes
// ran; its CPU time does not, so the cpu-ns/op metric compares the
// implementations' own cost.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
