package sharedbucket

import (
	"encoding/hex"
	"os"
	"strings"
	"sync/atomic"
	"time"
	_ "unsafe" // for go:linkname
)

// nanotime is the runtime's CLOCK_MONOTONIC reading through the vDSO: the
// absolute value every process on the host (in one time namespace) agrees on.
//
// Why the linkname: time.Now's monotonic part is relative to the process's
// start, so it cannot be compared across processes, and
// unix.ClockGettime is a real syscall (about 8× slower). The runtime keeps
// nanotime linkable on purpose ("Do not remove or change the type
// signature", go.dev/issue/67401).
//
//go:linkname nanotime runtime.nanotime
func nanotime() int64

// Now returns the current reading of the host's CLOCK_MONOTONIC in
// nanoseconds: the clock every table's TATs are written in. Use it with the
// …At methods to drive a table with explicit times.
func Now() int64 { return nanotime() }

// bootIDPath names the kernel's per-boot random UUID.
const bootIDPath = "/proc/sys/kernel/random/boot_id"

// bootID returns the 16 bytes of this boot's identity, or zeros if the kernel
// does not expose it (then reboots cannot be detected; files on tmpfs vanish
// at reboot anyway).
func bootID() [16]byte {
	var id [16]byte
	raw, err := os.ReadFile(bootIDPath)
	if err != nil {
		return id
	}
	s := strings.ReplaceAll(strings.TrimSpace(string(raw)), "-", "")
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != 16 {
		return id
	}
	copy(id[:], b)
	return id
}

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
