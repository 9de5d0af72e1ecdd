//go:build race

package adaptsim_test

// raceEnabled: under the race detector a 15-minute run costs ten times as
// much, so the tests run the callers' counts and phases that differ most.
const raceEnabled = true
