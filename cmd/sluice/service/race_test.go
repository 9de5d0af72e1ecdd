//go:build race

package service_test

// raceEnabled: the race detector slows code five to twenty times, so time
// bounds are not checked under it.
const raceEnabled = true
