//go:build !race

package ratelimiter_test

const raceEnabled = false
