//go:build !race

package leasealloc_test

const raceEnabled = false
