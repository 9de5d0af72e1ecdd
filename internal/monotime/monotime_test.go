package monotime_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/monotime"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Now agrees with time.Since over an interval measured both ways: the same
// clock, to within the gap between the two readings at each end.
func TestNowIsTheMonotonicClock(t *testing.T) {
	start, n0 := time.Now(), monotime.Now()
	var spin int
	for time.Since(start) < time.Millisecond { // a busy interval, no sleep
		spin++
	}
	n1, d := monotime.Now(), time.Since(start)
	assert.InDelta(t, float64(d), float64(n1-n0), float64(100*time.Microsecond))
	assert.Positive(t, spin)
	assert.GreaterOrEqual(t, monotime.Now(), n1, "never backwards")
}

func TestBubbled(t *testing.T) {
	assert.False(t, monotime.Bubbled(), "the test goroutine is in no bubble")
	synctest.Test(t, func(t *testing.T) {
		require.True(t, monotime.Bubbled())
		done := make(chan bool)
		go func() { done <- monotime.Bubbled() }() // goroutines started in a bubble are in it
		assert.True(t, <-done)
	})
}
