//go:build race

package leasesim_test

// raceEnabled: the race detector makes a run ten times dearer; the tests
// run shorter lengths under it.
const raceEnabled = true
