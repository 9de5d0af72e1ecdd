package vclock

import (
	"math/bits"
	"time"
)

// timerQueue holds a clock's entries, earliest (deadline, sequence) first:
// a radix queue whose buckets feed a small 4-ary heap.
//
// Why not the heap alone: with 100k timers armed (100k fibers asleep), a
// pop sifts an entry down eight levels of a 2.4 MB heap, about two cache
// lines and three unpredictable compares a level, and that was the largest
// single cost of a timer wake (BenchmarkVirtualTimers). A clock's deadlines
// never go below its current time, which is what a radix queue needs:
// entries after last sit unsorted in the bucket of the highest digit where
// their deadline differs from last (see bucketOf), appended in O(1); when
// the heap runs dry, the lowest non-empty bucket is scanned for its
// earliest deadline, which becomes last, and its entries move to lower
// buckets or, those at last, into the heap. An entry moves at most once
// per digit of its distance to last, and each move is a sequential read and
// an append, so a pop costs a few streaming accesses instead of a walk down
// a cold heap (BenchmarkRearm/timers=100000: about half the time a fire and
// re-arm took on the heap alone).
//
// Order among equal deadlines is the heap's (by sequence): every entry at
// last is in the heap, and so is any entry armed at or before last (last
// may run ahead of the clock's time after a look at the next deadline,
// Next or a FireNext that fires nothing, or a stale entry dropped from the
// top), so the heap's top is always the earliest entry.
//
// Memory: the chunks of emptied buckets stay on a free list for the
// clock's life, as the heap's slice kept its largest size.
type timerQueue struct {
	last    time.Duration         // every entry in a bucket has a later deadline
	n       int                   // entries, stale ones included
	low     timerHeap             // entries at or before last
	mask    [nBuckets / 64]uint64 // bit k set: buckets[k] is not empty
	buckets [nBuckets]*chunk      // see bucketOf
	free    *chunk                // emptied chunks, for reuse
}

// The buckets: a deadline after last is in bucket level·16 + digit, where
// level is the highest hex digit (4 bits) where it differs from last and
// digit is its own digit there. Deadlines in a lower bucket are earlier.
// Why digits of 4 bits and not single bits: an entry moves down at most
// once per level of its distance to last, so 16 levels instead of 64 move
// it a quarter as often, for 256 buckets instead of 64.
const (
	digitBits = 4
	nDigits   = 1 << digitBits
	nBuckets  = (64 + digitBits - 1) / digitBits * nDigits
)

func (q *timerQueue) bucketOf(when time.Duration) int {
	// Deadlines are never negative (the clock starts at offset 0 and
	// moves forward), so their bits order them.
	level := (bits.Len64(uint64(when^q.last)) - 1) / digitBits
	return level*nDigits + int(uint64(when)>>(level*digitBits))&(nDigits-1)
}

// A chunk holds entries of one bucket; a bucket is a chain of them, its
// first one filled last. Why chunks and not a slice per bucket: a bucket
// fills and empties over and over, and slices grown by append left
// several times the queue's size in garbage on each run of 100k timers;
// chunks go back to the queue's free list and are reused.
type chunk struct {
	next *chunk
	n    int
	e    [chunkLen]entry
}

const chunkLen = 42 // a chunk is 1 KiB

func (q *timerQueue) len() int { return q.n }

func (q *timerQueue) push(e entry) {
	q.n++
	if e.when <= q.last {
		q.low.push(e)
		return
	}
	q.toBucket(e)
}

// toBucket files e, which is after last, in its bucket.
func (q *timerQueue) toBucket(e entry) {
	k := q.bucketOf(e.when)
	c := q.buckets[k]
	if c == nil || c.n == chunkLen {
		c = q.newChunk(c)
		q.buckets[k] = c
		q.mask[k/64] |= 1 << (k % 64)
	}
	c.e[c.n] = e
	c.n++
}

// newChunk returns an empty chunk chained before next.
func (q *timerQueue) newChunk(next *chunk) *chunk {
	c := q.free
	if c != nil {
		q.free = c.next
	} else {
		c = new(chunk)
	}
	c.next = next
	return c
}

// release empties c and puts it on the free list.
func (q *timerQueue) release(c *chunk) {
	clear(c.e[:c.n]) // no Timer kept alive by a spare chunk
	c.n = 0
	c.next = q.free
	q.free = c
}

// top returns the earliest entry, stale or live; false if q is empty.
func (q *timerQueue) top() (entry, bool) {
	if len(q.low) == 0 && !q.refill() {
		return entry{}, false
	}
	return q.low[0], true
}

// pop removes the entry top returned.
func (q *timerQueue) pop() entry {
	q.n--
	return q.low.pop()
}

// refill moves the entries of the lowest non-empty bucket down, those with
// the earliest deadline into the heap; it reports false if q is empty.
// The heap is empty.
func (q *timerQueue) refill() bool {
	k := -1
	for i, w := range q.mask {
		if w != 0 {
			k = i*64 + bits.TrailingZeros64(w)
			break
		}
	}
	if k < 0 {
		return false
	}
	b := q.buckets[k]
	q.buckets[k] = nil
	q.mask[k/64] &^= 1 << (k % 64)
	m := b.e[0].when
	for c := b; c != nil; c = c.next {
		for _, e := range c.e[:c.n] {
			m = min(m, e.when)
		}
	}
	// m is the earliest deadline of all: every other bucket holds later
	// ones. The entries of higher buckets agree with m on the digits that
	// placed them, so they stay where they are; those of bucket k agree
	// with it on its level's digit and above, so they move to lower levels.
	q.last = m
	for c := b; c != nil; {
		for _, e := range c.e[:c.n] {
			if e.when == m {
				q.low.push(e)
			} else {
				q.toBucket(e)
			}
		}
		next := c.next
		q.release(c)
		c = next
	}
	return true
}

// filter keeps only the entries keep accepts, in O(entries).
func (q *timerQueue) filter(keep func(entry) bool) {
	kept := q.low[:0]
	for _, e := range q.low {
		if keep(e) {
			kept = append(kept, e)
		}
	}
	clear(q.low[len(kept):])
	q.low = kept
	q.low.heapify()
	q.n = len(q.low)
	for k, b := range q.buckets {
		// Kept entries go back to the same bucket: last has not moved.
		q.buckets[k] = nil
		q.mask[k/64] &^= 1 << (k % 64)
		for c := b; c != nil; {
			for _, e := range c.e[:c.n] {
				if keep(e) {
					q.toBucket(e)
					q.n++
				}
			}
			next := c.next
			q.release(c)
			c = next
		}
	}
}
