package bench_test

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// processCPU is the CPU time (user and system, every thread) process pid
// has used, read from /proc/PID/stat, or 0 when it cannot be read. Its
// unit is the kernel's clock tick (USER_HZ, 100 on Linux): 10 ms, small
// against the seconds of CPU a measured run takes.
func processCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// Fields are counted after the last ')': the command name (field 2)
	// may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 { // utime and stime, fields 14 and 15
		return 0
	}
	user, err1 := strconv.ParseInt(f[11], 10, 64)
	sys, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(user+sys) * (time.Second / 100)
}
