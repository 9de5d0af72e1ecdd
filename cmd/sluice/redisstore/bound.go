package redisstore

import (
	"time"

	"github.com/sluice-go/sluice/internal/monotime"
)

// The bound on calls that wait on a shared round trip (see pipeline.do):
// each is watched, with its deadline, and one timer wakes those whose
// deadline passes first.

// wait is one use of a call waiting on a shared round trip, and its
// deadline (monotime).
type wait struct {
	c   *call
	seq uint64
	at  int64
}

// over reports whether w's use of its call ended (answered, expired or a
// later use). The caller holds mu.
func (w *wait) over() bool { return w.c.seq != w.seq || w.c.state.Load() != waiting }

// watch adds c's use to the watched calls, its deadline p.timeout from
// now, and sets the timer if it is not set. The caller holds mu.
//
// Why one timer and not a context.WithTimeout per call: the per-call
// context costs a timer, its allocations and its parent's cancel
// bookkeeping on every decision, where one timer serves all. Every call's
// bound is the same, so deadlines come in the order calls
// are watched: the oldest watched call's deadline is the next one due,
// and one timer set for it serves all. Most calls are answered long
// before it; their entries are dropped from the front here, as later
// calls come, and by expire, so waits holds about the calls in flight.
func (p *pipeline) watch(c *call) {
	for p.head < len(p.waits) && p.waits[p.head].over() {
		p.waits[p.head] = wait{}
		p.head++
	}
	switch {
	case p.head == len(p.waits):
		p.waits, p.head = p.waits[:0], 0
	case p.head >= 64 && 2*p.head >= len(p.waits):
		n := copy(p.waits, p.waits[p.head:])
		clear(p.waits[n:])
		p.waits, p.head = p.waits[:n], 0
	}
	p.waits = append(p.waits, wait{c: c, seq: c.seq, at: monotime.Now() + int64(p.timeout)})
	if !p.armed && !p.stopped {
		p.armed = true
		p.timer.Reset(p.timeout)
	}
}

// expire runs when the timer fires: it wakes each watched call whose
// deadline has passed and that is still waiting, drops the calls that are
// over, and sets the timer for the next deadline, if any.
func (p *pipeline) expire() {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := monotime.Now()
	for ; p.head < len(p.waits); p.head++ {
		w := &p.waits[p.head]
		if !w.over() {
			if w.at > now {
				if !p.stopped {
					p.timer.Reset(time.Duration(w.at - now))
				}
				return
			}
			if w.c.state.CompareAndSwap(waiting, expired) {
				w.c.done <- struct{}{} // the use's only send: never blocks
			}
		}
		*w = wait{}
	}
	p.waits, p.head = p.waits[:0], 0
	p.armed = false
}
