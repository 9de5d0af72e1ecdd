package vclock_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluice-go/sluice/vclock"
)

// BenchmarkRearm is the timer queue alone under sched's
// BenchmarkVirtualTimers shape: N timers, timer j re-arming itself every
// N−j µs from its own callback; one op is one fire and one re-arm, with N
// timers armed throughout.
func BenchmarkRearm(b *testing.B) {
	for _, n := range []int{100_000, 1_000} {
		b.Run(fmt.Sprintf("timers=%d", n), func(b *testing.B) {
			c := vclock.New(time.Time{})
			ts := make([]*vclock.Timer, n)
			for j := range ts {
				d := time.Duration(n-j) * time.Microsecond
				ts[j] = c.AfterFunc(d, func() { ts[j].Reset(d) })
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				c.FireNext(vclock.Epoch().Add(1 << 62))
			}
		})
	}
}
