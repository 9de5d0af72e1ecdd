//go:build unix

package service_test

import "syscall"

// processCPU is the CPU time this process has used (user + system): on a
// shared machine, steadier than wall time, which also counts the time
// other programs ran.
func processCPU() (ns int64, ok bool) {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0, false
	}
	return ru.Utime.Nano() + ru.Stime.Nano(), true
}
