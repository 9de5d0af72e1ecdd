//go:build !race

package leasesim_test

const raceEnabled = false
