package store

import (
	"math"
	"sync/atomic"
)

// intervalCache remembers the emission interval T of the rates a store saw
// last, so that a decision does not divide and round per call (Interval is
// a tenth of a hot-key decision). It holds intervalWays rates, placed by
// their bits; a rate that finds its place taken by another is computed and
// takes the place over. Lookups take no lock: each entry is a seqlock whose
// writers claim it with a compare-and-swap, and a reader that saw a write
// in progress or finished meanwhile computes T itself.
type intervalCache struct {
	ways [intervalWays]intervalEntry
}

const intervalWays = 8 // a power of two

type intervalEntry struct {
	seq  atomic.Uint64 // odd while a writer fills the entry
	rate atomic.Uint64 // math.Float64bits of the rate; 0 (never a valid rate) while empty
	t    atomic.Int64
	_    [40]byte // one entry per cache line: a writer does not slow the readers of other rates
}

// of returns Policy{Rate: rate}.Interval() in nanoseconds.
func (c *intervalCache) of(rate float64) int64 {
	bits := math.Float64bits(rate)
	e := &c.ways[(bits^bits>>32^bits>>45)&(intervalWays-1)]
	seq := e.seq.Load()
	if seq&1 == 0 && e.rate.Load() == bits {
		t := e.t.Load()
		if e.seq.Load() == seq {
			return t
		}
	}
	t := int64(Policy{Rate: rate}.Interval())
	if seq&1 == 0 && e.seq.CompareAndSwap(seq, seq+1) {
		e.rate.Store(bits)
		e.t.Store(t)
		e.seq.Store(seq + 2)
	}
	return t
}
