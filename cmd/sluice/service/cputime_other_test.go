//go:build !unix

package service_test

// processCPU is not measured here: time bounds fall back to wall time.
func processCPU() (ns int64, ok bool) { return 0, false }
