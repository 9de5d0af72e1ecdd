package queue_test

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/queue"
)

// wordSource is a Settler whose free units live, while settled, in a word
// that take decrements without the queue's lock (a rate limiter's fast
// path in miniature). Its methods record misuse by the queue: a Settle
// while someone waits, or after Close.
type wordSource struct {
	word    atomic.Int64 // free units while settled; -1 while the queue holds them
	waiting bool         // the last Fill was told someone waits; guarded by the queue's lock
	closed  bool
	misuse  []string
}

const wordHeld = -1

// take takes n units on the word; decided is false while the queue holds
// them.
func (s *wordSource) take(n int64) (ok, decided bool) {
	for {
		w := s.word.Load()
		if w == wordHeld {
			return false, false
		}
		if w < n {
			return false, true
		}
		if s.word.CompareAndSwap(w, w-n) {
			return true, true
		}
	}
}

func (s *wordSource) hold(avail int64) int64 {
	if w := s.word.Swap(wordHeld); w != wordHeld {
		avail += w
	}
	return avail
}

func (s *wordSource) Now() time.Time { return time.Time{} }
func (s *wordSource) Fill(_ time.Time, avail, _ int64, waiting bool) int64 {
	s.waiting = waiting
	return s.hold(avail)
}
func (s *wordSource) Due(now time.Time, _, _ int64) (time.Time, bool) { return now, true }
func (s *wordSource) Take(int64) int64                                { return 0 }
func (s *wordSource) Return(_, _ time.Time, avail, n, _ int64) int64  { return s.hold(avail) + n }

func (s *wordSource) Settle(_ time.Time, avail int64) int64 {
	if s.waiting {
		s.misuse = append(s.misuse, "Settle while someone waits")
	}
	if s.closed {
		s.misuse = append(s.misuse, "Settle after Close")
	}
	s.word.Store(avail)
	return 0
}

// TestSettlerHoldsWhileAnyoneWaits: a queue whose Source keeps its units in
// a lock-free word while nobody waits. The word is never handed back while
// a caller is parked (a take on the word then would pass it), it is handed
// back when the queue empties, and never after Close; no unit is lost
// across the moves.
func TestSettlerHoldsWhileAnyoneWaits(t *testing.T) {
	src := &wordSource{}
	src.word.Store(3)
	q := queue.New(queue.Config{Reason: "test", Source: src, Clock: mockClock()})
	ok, decided := src.take(1)
	require.True(t, ok && decided)
	_, ok = q.TryAcquire(1) // under the lock: holds, takes, hands back
	require.True(t, ok)
	assert.Equal(t, int64(1), src.word.Load(), "handed back with what is left")

	got := make(chan error, 1)
	go func() {
		_, err := q.Acquire(context.Background(), 3)
		got <- err
	}()
	waitFor(t, func() bool { return q.Waiters() == 1 })
	_, decided = src.take(1)
	assert.False(t, decided, "the word is held while a caller waits")
	_, ok = q.TryAcquire(1)
	assert.False(t, ok, "no barging")
	q.Release(2) // 1 held + 2: the head's 3
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(10 * time.Second): // a failure guard only
		q.Close(context.Canceled)
		<-got
		t.Fatal("the head was never granted its units")
	}
	assert.Equal(t, int64(0), src.word.Load(), "handed back once the queue is empty")

	q.Release(2)
	ok, decided = src.take(2)
	require.True(t, ok && decided)
	q.Release(1)
	require.True(t, q.Close(context.Canceled))
	src.closed = true // read by Settle under the lock only: Close has returned
	_, decided = src.take(1)
	assert.False(t, decided, "held for good after Close")
	q.Release(1)
	assert.Equal(t, int64(2), q.Available(), "the units of the Close instant, and Release after it")
	assert.Empty(t, src.misuse)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		runtime.Gosched()
	}
}
