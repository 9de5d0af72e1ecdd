package main

import (
	"bytes"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The same program gives the same log, to the nanosecond, every run.
func TestRunIsRepeatable(t *testing.T) {
	var first bytes.Buffer
	require.NoError(t, run(&first))
	assert.Equal(t, 9, bytes.Count(first.Bytes(), []byte("\n")))
	for i := 0; i < 5; i++ {
		var again bytes.Buffer
		require.NoError(t, run(&again))
		require.Equal(t, first.String(), again.String())
	}
}

func Example() {
	_ = run(os.Stdout)
	// Output:
	// 01:01:30  hourly   round 1: reply after 1m30s
	// 02:03:00  hourly   round 2: reply after 1m30s
	// 03:04:30  hourly   round 3: reply after 1m30s
	// 06:05:00  6-hourly round 1: gave up after 5m0s (context deadline exceeded)
	// 12:10:00  6-hourly round 2: gave up after 5m0s (context deadline exceeded)
	// 18:15:00  6-hourly round 3: gave up after 5m0s (context deadline exceeded)
	// 23:30:00  nightly  round 1: reply after 30m0s
	// 00:20:00  6-hourly round 4: gave up after 5m0s (context deadline exceeded)
	// 00:20:00  main     all pollers done
}
