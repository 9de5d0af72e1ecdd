package ratelimiter_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/ratelimiter"
)

const ms = time.Millisecond

// tenAtTen makes 10 Acquires on a limiter of 10/s, burst 1, and returns when
// each returned, as an offset from the start.
func tenAtTen(t *testing.T) []time.Duration {
	l, err := ratelimiter.New(context.Background(), 10, 1)
	require.NoError(t, err)
	start := time.Now()
	var got []time.Duration
	for range 10 {
		require.NoError(t, l.Acquire(context.Background(), 1))
		got = append(got, time.Since(start))
	}
	return got
}

// TestSynctest: a goroutine-mode limiter (no clock option) runs on a
// synctest bubble's fake time, exactly, in any number of bubbles, before and
// after plain use. Pooled waiters must not carry channels across bubbles
// ("receive on synctest channel from outside bubble", or a hang).
func TestSynctest(t *testing.T) {
	plain := func() {
		l, err := ratelimiter.New(context.Background(), 1e6, 1)
		require.NoError(t, err)
		for range 3 {
			require.NoError(t, l.Acquire(context.Background(), 1)) // parks: burst 1
		}
	}
	plain()
	want := []time.Duration{0, 100 * ms, 200 * ms, 300 * ms, 400 * ms, 500 * ms, 600 * ms, 700 * ms, 800 * ms, 900 * ms}
	for range 3 {
		synctest.Test(t, func(t *testing.T) {
			assert.Equal(t, want, tenAtTen(t))
			// A wait that outlives its ctx ends at the deadline, on fake time.
			l, err := ratelimiter.New(context.Background(), 1, 1)
			require.NoError(t, err)
			require.True(t, l.TryAcquire(1))
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			done := make(chan error)
			go func() { done <- l.Acquire(ctx, 1) }()
			synctest.Wait()
			assert.Equal(t, 1, l.Waiters())
			assert.NoError(t, <-done) // the token comes at +1s
		})
	}
	plain()
}

// Example_synctest shows a test of code that uses a limiter, run in a
// testing/synctest bubble: a limiter made with no clock option runs on the
// bubble's fake time, so 10 Acquires at 10/s with a burst of 1 return at
// exactly +0s, +100ms, … +900ms, with no real waiting. (An Example cannot
// start a bubble; TestSynctest runs this same code.)
func Example_synctest() {
	testRefill := func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			l, err := ratelimiter.New(context.Background(), 10, 1)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			for i := range 10 {
				if err := l.Acquire(context.Background(), 1); err != nil {
					t.Fatal(err)
				}
				if got, want := time.Since(start), time.Duration(i)*100*time.Millisecond; got != want {
					t.Errorf("Acquire %d returned at +%v, want +%v", i, got, want)
				}
			}
		})
	}
	_ = testRefill // func TestRefill(t *testing.T) { testRefill(t) }
}
