package main_test

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// processCPU is the CPU time (user + system, all threads) process pid has
// used, from /proc/PID/stat, and whether it could be read. Its resolution
// is the kernel's clock tick (USER_HZ, 100 on Linux): 10 ms, well under
// 1% of the seconds of CPU a measuring run spends.
func processCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// Why after the last ')': the command name, field 2, may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 { // utime and stime are fields 14 and 15: f[11], f[12]
		return 0, false
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(ut+st) * (time.Second / 100), true
}
