//go:build !unix

package bench_test

import "time"

// cpuTime is not measured here: the cpu-ns/op metric reads 0.
func cpuTime() time.Duration { return 0 }
