//go:build !unix

package cli

// processCPU is not measured here; the cpu-ns/op metric reads 0.
func processCPU() int64 { return 0 }
