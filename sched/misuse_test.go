package sched_test

import (
	"context"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/sched"
)

// TestWaiterMisuseRaceFree: a fiber's ctx used to park from a plain
// goroutine (here the goroutine of a Blocking call, while the loop idles)
// panics with a clear message, and the check itself is race-free: under
// -race, the check's read of the loop's running fiber must not race with
// the loop's resume.
func TestWaiterMisuseRaceFree(t *testing.T) {
	err := sched.Run(context.Background(), func(ctx context.Context) error {
		return sched.Blocking(ctx, func() error {
			// The loop clears its running fiber once main has parked in
			// Blocking; until then Prepare binds to main (harmless: no
			// Wait follows). Yield until the check sees the idle loop.
			for range 1_000_000 {
				var msg any
				func() {
					defer func() { msg = recover() }()
					var w sched.Waiter
					w.Prepare(ctx)
				}()
				if msg != nil {
					assert.Contains(t, msg, "outside the loop's fibers")
					return nil
				}
				runtime.Gosched()
			}
			t.Error("Prepare never saw the idle loop")
			return nil
		})
	})
	require.NoError(t, err)
}
