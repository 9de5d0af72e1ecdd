package ratelimiter_test

import (
	"strconv"

	"github.com/benbjohnson/clock"
)

func formatFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
func formatInt(i int) string       { return strconv.Itoa(i) }

// newFrozenMock returns a mock clock that nobody advances.
func newFrozenMock() *clock.Mock { return clock.NewMock() }
