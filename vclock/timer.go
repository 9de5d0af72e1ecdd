package vclock

import (
	"container/heap"
	"time"
)

// A Timer is a callback armed on a Clock by AfterFunc. Its methods are safe
// for concurrent use, including from inside any timer's callback.
type Timer struct {
	c     *Clock
	f     func()
	when  time.Duration // deadline as an offset from c.base
	seq   uint64
	index int // position in c.timers, -1 when not armed; guarded by c.mu
}

// Stop disarms the timer. It reports whether it stopped the timer, false if
// the timer had already fired or been stopped.
func (t *Timer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.index < 0 {
		return false
	}
	heap.Remove(&t.c.timers, t.index)
	return true
}

// Reset re-arms the timer to fire d after the clock's current time, as a
// newly created timer (it orders after timers that already exist at the
// same deadline). It reports whether the timer was armed before the call.
func (t *Timer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	armed := t.index >= 0
	if armed {
		heap.Remove(&t.c.timers, t.index)
	}
	t.c.arm(t, d)
	return armed
}

// When returns the deadline the timer was last armed for.
func (t *Timer) When() time.Time {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	return t.c.base.Add(t.when)
}

// timerHeap orders timers by (deadline, creation sequence).
type timerHeap []*Timer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if h[i].when != h[j].when {
		return h[i].when < h[j].when
	}
	return h[i].seq < h[j].seq
}
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *timerHeap) Push(x any) {
	t := x.(*Timer)
	t.index = len(*h)
	*h = append(*h, t)
}
func (h *timerHeap) Pop() any {
	old := *h
	n := len(old)
	t := old[n-1]
	old[n-1] = nil
	t.index = -1
	*h = old[:n-1]
	return t
}
