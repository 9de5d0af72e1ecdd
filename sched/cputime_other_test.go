//go:build !unix

package sched_test

import "time"

// cpuTime is not measured here: the cpu-ns/fiber metric reads 0.
func cpuTime() time.Duration { return 0 }
