//go:build !race

package sharedbucket

// add counts one decision on the caller's P. While pinned, no other
// goroutine can run on this P, so a plain read-modify-write is exact and
// costs ~1 ns where a locked add costs ~5 (a third of a check). Stats reads
// the words with atomic loads; a word-sized store cannot tear.
func (c *counters) add(allowed bool) {
	r := &c.rows[procPin()&c.mask]
	if allowed {
		r.allowed++
	} else {
		r.denied++
	}
	procUnpin()
}
