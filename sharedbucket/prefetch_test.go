//go:build linux || darwin

package sharedbucket

import (
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
)

// TestPrefetchNeverFaults: prefetch is a hint, so an address with nothing
// mapped behind it (here nil) is ignored, as are the first and last slots
// of a table.
func TestPrefetchNeverFaults(t *testing.T) {
	tb := openTemp(t, Policy{Limit: 10, Window: time.Second})
	assert.NotPanics(t, func() {
		prefetch(nil)
		prefetch(unsafe.Pointer(slotAt(tb.slots, 0)))
		prefetch(unsafe.Pointer(slotAt(tb.slots, tb.mask)))
	})
}
