package vclock

import (
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/internal/vwake"
)

// Why hooks and not exported functions: a timer that wakes a waiter
// directly, and a look at fires in flight, are sched's needs, not ones of
// this package's users.
func init() {
	vwake.Bind = func(t, c any, w vwake.Waker) {
		tt := t.(*Timer)
		tt.c, tt.w = c.(*Clock), w
	}
	vwake.Watch = func(c any, ended func()) *atomic.Int32 {
		cc := c.(*Clock)
		cc.mu.Lock()
		cc.ended = ended
		cc.mu.Unlock()
		return &cc.firing
	}
}

// A Timer is a callback armed on a Clock by AfterFunc. Its methods are safe
// for concurrent use, including from inside any timer's callback.
type Timer struct {
	c *Clock
	f func()
	w vwake.Waker // instead of f, for a timer bound by vwake.Bind

	// Guarded by c.mu.
	when  time.Duration // deadline as an offset from c.base
	seq   uint64        // the sequence number of its live heap entry
	armed bool
}

// Stop disarms the timer. It reports whether it stopped the timer, false if
// the timer had already fired or been stopped.
func (t *Timer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if !t.armed {
		return false
	}
	t.c.disarm(t)
	return true
}

// Reset re-arms the timer to fire d after the clock's current time, as a
// newly created timer (it orders after timers that already exist at the
// same deadline). It reports whether the timer was armed before the call.
func (t *Timer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	armed := t.armed
	if armed {
		t.c.disarm(t)
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

// An entry is one arming of a timer in the heap. Deadline and sequence sit
// in the entry itself, so ordering never chases a pointer; a stopped or
// re-armed timer leaves its old entry behind as stale (t.seq moved on or
// t.armed is false), skipped when it reaches the top and swept out when
// stale entries outnumber live ones.
type entry struct {
	when time.Duration
	seq  uint64
	t    *Timer
}

func (e entry) live() bool { return e.t.armed && e.t.seq == e.seq }

func (e entry) before(o entry) bool {
	if e.when != o.when {
		return e.when < o.when
	}
	return e.seq < o.seq
}

// timerHeap is a 4-ary min-heap of entries by (deadline, sequence), the
// part of a timerQueue that orders what is due first: the entries at or
// before the queue's last, few at a time in the usual run.
type timerHeap []entry

func (h *timerHeap) push(e entry) {
	*h = append(*h, e)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 4
		if !s[i].before(s[p]) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *timerHeap) pop() entry {
	s := *h
	top := s[0]
	n := len(s) - 1
	s[0] = s[n]
	s[n] = entry{}
	s = s[:n]
	*h = s
	s.down(0)
	return top
}

func (s timerHeap) down(i int) {
	n := len(s)
	for {
		c := 4*i + 1
		if c >= n {
			return
		}
		m := c
		for k := c + 1; k < c+4 && k < n; k++ {
			if s[k].before(s[m]) {
				m = k
			}
		}
		if !s[m].before(s[i]) {
			return
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
}

func (s timerHeap) heapify() {
	for i := (len(s) - 2) / 4; i >= 0; i-- {
		s.down(i)
	}
}
