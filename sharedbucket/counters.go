package sharedbucket

import (
	"runtime"
	"sync/atomic"
	_ "unsafe" // for go:linkname
)

// Why per-P counters: Stats must count allowed and denied requests, but any
// counter written by every call is a cache line that every core takes
// exclusive on every call: with one shared counter, two goroutines on two
// keys, and even read-only denials, would contend for that line on every
// call. So each P (scheduler slot) has its own line,
// and a call pins its goroutine to its P while it adds (as sync.Pool does).

//go:linkname procPin runtime.procPin
func procPin() int

//go:linkname procUnpin runtime.procUnpin
func procUnpin()

// row is one P's counters, alone on a 128-byte pair of cache lines: the
// adjacent-line prefetcher of x86 cores pulls lines in pairs, so two rows on
// neighbouring 64-byte lines still slow each other down.
type row struct {
	allowed uint64
	denied  uint64
	_       [112]byte
}

// counters are the process-local allowed/denied counts of one Table.
type counters struct {
	_    [128]byte // keep the first row off the lines of whatever precedes it
	rows []row
	mask int
}

func newCounters() *counters {
	n := 2
	for n < runtime.GOMAXPROCS(0) || n < runtime.NumCPU() {
		n <<= 1
	}
	// If GOMAXPROCS is later raised above n, two Ps share a row and an add
	// can (rarely) be lost: the counts are statistics, not limits.
	return &counters{rows: make([]row, n), mask: n - 1}
}

// sum returns the totals over every row.
func (c *counters) sum() (allowed, denied uint64) {
	for i := range c.rows {
		allowed += atomic.LoadUint64(&c.rows[i].allowed)
		denied += atomic.LoadUint64(&c.rows[i].denied)
	}
	return allowed, denied
}
