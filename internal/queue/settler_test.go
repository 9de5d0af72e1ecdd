package queue_test

import (
	"context"
	"math"
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
// path in miniature). Its methods record misuse by the queue: a Source
// method called while the word has the state (no Hold first), a Hold of a
// state the word does not have, a Settle while someone waits or after
// Close.
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

// held records a Source method called while the word has the state.
func (s *wordSource) held(method string) {
	if s.word.Load() != wordHeld {
		s.misuse = append(s.misuse, method+" before Hold")
	}
}

func (s *wordSource) Now() time.Time { return time.Time{} }
func (s *wordSource) Take(int64) int64 {
	s.held("Take")
	return 0
}

func (s *wordSource) Fill(_ time.Time, avail, _ int64, waiting bool) int64 {
	s.held("Fill")
	s.waiting = waiting
	return avail
}

func (s *wordSource) Due(now time.Time, _, _ int64) (time.Time, bool) {
	s.held("Due")
	return now, true
}

func (s *wordSource) Return(_, _ time.Time, avail, n, _ int64) int64 {
	s.held("Return")
	return avail + n
}

func (s *wordSource) Hold() int64 {
	w := s.word.Swap(wordHeld)
	if w == wordHeld {
		s.misuse = append(s.misuse, "Hold while held")
		return 0
	}
	return w
}

func (s *wordSource) Settle(avail int64) bool {
	s.held("Settle")
	if s.waiting {
		s.misuse = append(s.misuse, "Settle while someone waits")
	}
	if s.closed {
		s.misuse = append(s.misuse, "Settle after Close")
	}
	s.word.Store(avail)
	return true
}

// TestSettlerHoldsWhileAnyoneWaits: a queue whose Source keeps its units in
// a lock-free word while nobody waits. The word is never handed back while
// a caller is parked (a take on the word then would pass it), it is handed
// back when the queue empties, and never after Close; no unit is lost
// across the moves.
func TestSettlerHoldsWhileAnyoneWaits(t *testing.T) {
	src := &wordSource{}
	src.word.Store(wordHeld)
	q := queue.New(queue.Config{Reason: "test", Avail: 3, Source: src, Clock: mockClock()})
	require.Equal(t, int64(3), src.word.Load(), "settled at once")
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
	q.Release(2, math.MaxInt64) // 1 held + 2: the head's 3
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(10 * time.Second): // a failure guard only
		q.Close(context.Canceled)
		<-got
		t.Fatal("the head was never granted its units")
	}
	assert.Equal(t, int64(0), src.word.Load(), "handed back once the queue is empty")

	q.Release(2, math.MaxInt64)
	ok, decided = src.take(2)
	require.True(t, ok && decided)
	q.Release(1, math.MaxInt64)
	require.True(t, q.Close(context.Canceled))
	src.closed = true // read by Settle under the lock only: Close has returned
	_, decided = src.take(1)
	assert.False(t, decided, "held for good after Close")
	q.Release(1, math.MaxInt64)
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
