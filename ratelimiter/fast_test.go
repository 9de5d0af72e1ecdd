package ratelimiter_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/ratelimiter"
)

// TestFastNoLossRacingLockedCalls: goroutines race TryAcquire (the
// lock-free word) against calls that take the state under the lock and
// hand it back (Tokens, SetBurst to the same burst, failing Acquires with a
// done ctx) on a frozen mock: exactly the burst is handed out, no token
// twice and none lost, and exactly k more once k intervals pass.
func TestFastNoLossRacingLockedCalls(t *testing.T) {
	const burst = 2000
	mock := clock.NewMock()
	l, err := ratelimiter.New(context.Background(), 1000, burst, ratelimiter.WithClock(mock))
	require.NoError(t, err)
	var granted atomic.Int64
	take := func() {
		var wg sync.WaitGroup
		for range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for l.TryAcquire(1) {
					granted.Add(1)
				}
			}()
		}
		stop := make(chan struct{})
		churned := make(chan struct{})
		go func() {
			defer close(churned)
			done, cancel := context.WithCancel(context.Background())
			cancel()
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = l.Tokens()
				_ = l.SetBurst(burst)
				_ = l.Acquire(done, 1)
			}
		}()
		wg.Wait()
		close(stop)
		<-churned
	}
	take()
	assert.Equal(t, int64(burst), granted.Load())
	assert.Zero(t, l.Tokens())
	mock.Add(37 * time.Millisecond) // 37 tokens at 1000/s
	take()
	assert.Equal(t, int64(burst+37), granted.Load())
	assert.Zero(t, l.Tokens())
}

// TestFastNoBargingPastCollectingHead: a head waiter collecting tokens
// (n = 2 on a burst of 1) holds the state under the lock; while it waits,
// a token sits in the queue and TryAcquire and Acquire from other
// goroutines must not take it. The head gets both tokens; afterwards the
// lock-free path serves again, exactly on the interval.
func TestFastNoBargingPastCollectingHead(t *testing.T) {
	mock := clock.NewMock()
	l, err := ratelimiter.New(context.Background(), 10, 1, ratelimiter.WithClock(mock))
	require.NoError(t, err)
	require.True(t, l.TryAcquire(1))
	head := make(chan error, 1)
	go func() { head <- l.Acquire(context.Background(), 2) }()
	waitFor(t, "the head to park", func() bool { return l.Waiters() == 1 })
	mock.Add(100 * time.Millisecond) // one token: the head collects it
	var wg sync.WaitGroup
	var barged atomic.Int64
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				if l.TryAcquire(1) {
					barged.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	assert.Zero(t, barged.Load(), "TryAcquire passed the parked head")
	mock.Add(100 * time.Millisecond) // the second: the head is granted
	require.NoError(t, <-head)
	assert.Equal(t, 0, l.Waiters())
	assert.False(t, l.TryAcquire(1))
	mock.Add(99 * time.Millisecond)
	assert.False(t, l.TryAcquire(1))
	mock.Add(time.Millisecond)
	assert.True(t, l.TryAcquire(1))
	assert.False(t, l.TryAcquire(1))
}

// TestFastStopThenTry: Stop on a limiter whose state is in the lock-free
// word (full, nobody ever waited): TryAcquire returns false and Acquire
// ErrStopped from then on, although the bucket is full.
func TestFastStopThenTry(t *testing.T) {
	for _, rate := range []float64{10, 3, 7.3} { // fast words in ns and 1/3 ns, none
		l, err := ratelimiter.New(context.Background(), rate, 5, ratelimiter.WithClock(newFrozenMock()))
		require.NoError(t, err)
		require.True(t, l.TryAcquire(1))
		require.True(t, l.Stop())
		assert.False(t, l.TryAcquire(1), "rate %v", rate)
		assert.ErrorIs(t, l.Acquire(context.Background(), 1), ratelimiter.ErrStopped)
		assert.Equal(t, 4.0, l.Tokens())
	}
}

// TestFastSetRateLive: SetRate and SetBurst on a live limiter whose state is
// in the lock-free word, across rates with a fast path (10/s, 5/s; 3/s in
// 1/3 ns units) and one without (7.3/s): the fraction accrued is kept and
// every token comes at its exact instant.
func TestFastSetRateLive(t *testing.T) {
	mock := clock.NewMock()
	l, err := ratelimiter.New(context.Background(), 10, 1, ratelimiter.WithClock(mock))
	require.NoError(t, err)
	require.True(t, l.TryAcquire(1))
	mock.Add(50 * time.Millisecond) // half a token at 10/s
	require.NoError(t, l.SetRate(5))
	mock.Add(99 * time.Millisecond) // the other half takes 100 ms at 5/s
	assert.False(t, l.TryAcquire(1))
	mock.Add(time.Millisecond)
	assert.True(t, l.TryAcquire(1))
	require.NoError(t, l.SetRate(3)) // 333,333,333⅓ ns a token: due at the ns after
	mock.Add(333333333 * time.Nanosecond)
	assert.False(t, l.TryAcquire(1))
	mock.Add(time.Nanosecond)
	assert.True(t, l.TryAcquire(1))
	require.NoError(t, l.SetRate(7.3)) // 136,986,301.37 ns a token: the locked path
	mock.Add(136986301 * time.Nanosecond)
	assert.False(t, l.TryAcquire(1))
	mock.Add(time.Nanosecond)
	assert.True(t, l.TryAcquire(1))
	require.NoError(t, l.SetRate(10))
	require.NoError(t, l.SetBurst(3))
	mock.Add(300 * time.Millisecond)
	assert.False(t, l.TryAcquire(4), "more than the burst")
	assert.True(t, l.TryAcquire(3))
	assert.False(t, l.TryAcquire(1))
	require.NoError(t, l.SetBurst(1))
	mock.Add(time.Hour)
	assert.False(t, l.TryAcquire(2), "the smaller burst holds")
	assert.True(t, l.TryAcquire(1))
}

// TestFastSynctest: TryAcquire and Acquire with the tokens there, on a
// limiter made in a synctest bubble, run on the bubble's fake time to the
// nanosecond.
func TestFastSynctest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, err := ratelimiter.New(context.Background(), 10, 2)
		require.NoError(t, err)
		require.True(t, l.TryAcquire(2))
		assert.False(t, l.TryAcquire(1))
		time.Sleep(100*time.Millisecond - 1)
		assert.False(t, l.TryAcquire(1))
		// In the bubble, Sleep moves the fake clock: here the last nanosecond
		// to the token's instant (synctest.Wait or a Gosched would not move it).
		time.Sleep(time.Nanosecond)
		assert.True(t, l.TryAcquire(1))
		time.Sleep(time.Hour)
		require.NoError(t, l.Acquire(context.Background(), 2))
		assert.False(t, l.TryAcquire(1), "nothing banked beyond the burst")
	})
}
