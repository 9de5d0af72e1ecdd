//go:build !race

package adaptsim_test

const raceEnabled = false
