package sharedbucket

import (
	"fmt"
	"os"
	"time"

	"github.com/sluice-go/sluice/store"
)

// DefaultSlots is the slot count of a table opened without WithSlots:
// 65536 keys in a 1 MiB file.
const DefaultSlots = 1 << 16

// MaxSlots is the largest slot count WithSlots accepts (a 16 GiB file).
const MaxSlots = 1 << 30

// minSlots is the smallest table: one probe window.
const minSlots = probeWindow

// An Option configures Open and Arena.Rate.
type Option func(*config)

type config struct {
	slots      int           // requested; rounded up to a power of two ≥ minSlots
	failClosed bool          // deny (instead of allow) when the CAS retry bound is hit
	mode       os.FileMode   // permission bits of a created file
	coarse     time.Duration // > 0: WithCoarseClock's refresh period
	err        error         // first invalid option, reported by Open
}

func defaultConfig() config {
	return config{slots: DefaultSlots, mode: 0o600}
}

// WithSlots sets how many keys the table holds, rounded up to a power of two
// (at least 8, at most MaxSlots). The slot count is part of a table's
// identity: attaching with another count is refused with ErrPolicyMismatch.
// Each slot takes 16 bytes of the file. Size it above the number of keys
// live at once (a key whose bucket is full takes no slot); when a probe
// window of 8 slots is all live, a new key evicts the bucket nearest to full,
// which is counted in Stats.Evicted.
func WithSlots(n int) Option {
	return func(c *config) {
		if n < 1 || n > MaxSlots {
			c.setErr(fmt.Errorf("sharedbucket: WithSlots(%d): must be in [1, %d]", n, MaxSlots))
			return
		}
		c.slots = n
	}
}

// WithFailMode says what this handle answers a request when it cannot land
// its compare-and-swap within the retry bound (extreme contention on one
// key): store.FailOpen (the default, as is the zero FailMode) allows it,
// store.FailClosed denies it. Either way the event is counted in
// Stats.Contended. Use it for limits where a false "yes" is worse than a
// false "no" (logins, password resets). It is per handle, not stored in the
// file.
func WithFailMode(m store.FailMode) Option {
	return func(c *config) { c.failClosed = m == store.FailClosed }
}

// WithMode sets the permission bits of a file this handle creates (default
// 0600: only the owner's processes can share the table). Attaching to a file
// that grants write access beyond these bits is refused, as is a file owned
// by another user. Only permission bits (0777) are allowed.
func WithMode(perm os.FileMode) Option {
	return func(c *config) {
		if perm&^0o777 != 0 || perm&0o600 != 0o600 {
			c.setErr(fmt.Errorf("sharedbucket: WithMode(%O): want permission bits including 0600", perm))
			return
		}
		c.mode = perm
	}
}

// MinCoarseResolution is the finest resolution WithCoarseClock accepts.
const MinCoarseResolution = 50 * time.Microsecond

// WithCoarseClock makes this handle read the time from a clock that a
// goroutine of its own refreshes every res (a CLOCK_MONOTONIC reading stored
// in an atomic), instead of reading CLOCK_MONOTONIC on every call. Where a
// clock read is expensive (on many virtual machines it costs more than the
// rest of a check; BenchmarkClock measures it) this cuts the cost of a check by that
// much.
//
// The price: decisions are dated up to res (plus any delay of the refreshing
// goroutine) in the past. For decision times the bound b + (e−s)/T still
// holds exactly; against real time a key can get up to res/T extra tokens
// in a window (and, while the refresher runs late, it is tighter instead).
// Other processes are unaffected and may use either clock. The goroutine
// stops at Close. Default: off. res must be at least MinCoarseResolution.
func WithCoarseClock(res time.Duration) Option {
	return func(c *config) {
		if res < MinCoarseResolution {
			c.setErr(fmt.Errorf("sharedbucket: WithCoarseClock(%v): must be ≥ %v", res, MinCoarseResolution))
			return
		}
		c.coarse = res
	}
}

func (c *config) setErr(err error) {
	if c.err == nil {
		c.err = err
	}
}

// roundSlots rounds n up to a power of two, at least minSlots.
func roundSlots(n int) int {
	s := minSlots
	for s < n {
		s <<= 1
	}
	return s
}

// prepare validates p and applies opts: what Open and Arena.Rate both need
// before they touch a file. An invalid value is an error naming it.
func prepare(p Policy, opts []Option) (canon, config, error) {
	c, err := p.canon()
	if err != nil {
		return canon{}, config{}, err
	}
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	return c, cfg, cfg.err
}
