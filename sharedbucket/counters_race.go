//go:build race

package sharedbucket

import "sync/atomic"

// add counts one decision on the caller's P. The race detector cannot know
// that pinning serialises the writers of a row, so race builds use atomic
// adds (same counts, slower).
func (c *counters) add(allowed bool) {
	r := &c.rows[procPin()&c.mask]
	if allowed {
		atomic.AddUint64(&r.allowed, 1)
	} else {
		atomic.AddUint64(&r.denied, 1)
	}
	procUnpin()
}
