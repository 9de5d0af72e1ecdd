//go:build !linux

package bench_test

import "time"

// processCPU is not read here (it needs Linux's /proc): the CPU columns of
// TestServiceVsPeers read "-".
func processCPU(int) time.Duration { return 0 }
