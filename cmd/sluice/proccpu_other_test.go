//go:build !linux

package main_test

import "time"

// processCPU reports that another process's CPU time is not read here
// (Linux only: /proc/PID/stat).
func processCPU(int) (time.Duration, bool) { return 0, false }
