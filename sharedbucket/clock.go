package sharedbucket

import (
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/internal/monotime"
)

// nanotime is the runtime's monotonic clock (see monotime.Now): an absolute
// reading every process on the host (in one time namespace) agrees on.
func nanotime() int64 { return monotime.Now() }

// Now returns the current reading of the host's monotonic clock in
// nanoseconds (Linux: CLOCK_MONOTONIC; macOS: mach_absolute_time, which is
// CLOCK_UPTIME_RAW): the clock every table's TATs are written in. Use it with the
// …At methods to drive a table with explicit times.
func Now() int64 { return nanotime() }

// coarseClock is a CLOCK_MONOTONIC reading refreshed by a goroutine (see
// WithCoarseClock). The reading sits alone on its cache line: every check
// reads it, only the refresher writes it.
type coarseClock struct {
	_    [64]byte
	now  atomic.Int64
	_    [56]byte
	quit chan struct{}
	done chan struct{}
}

func startCoarseClock(res time.Duration) *coarseClock {
	c := &coarseClock{quit: make(chan struct{}), done: make(chan struct{})}
	c.now.Store(nanotime())
	go func() {
		defer close(c.done)
		tk := time.NewTicker(res)
		defer tk.Stop()
		for {
			select {
			case <-tk.C:
				c.now.Store(nanotime())
			case <-c.quit:
				return
			}
		}
	}()
	return c
}

// stop ends the refresher and waits for it.
func (c *coarseClock) stop() {
	close(c.quit)
	<-c.done
}
