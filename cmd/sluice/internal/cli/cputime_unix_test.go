//go:build unix

package cli

import "syscall"

// processCPU is the CPU time this process has used (user + system), in
// nanoseconds: on a shared machine, CPU per request is steadier than wall
// time per request, which also counts the time other programs ran.
func processCPU() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
