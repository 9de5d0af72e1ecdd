package sched

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A Blocking goroutine wakes its fiber first and drops the count of calls
// in flight after; in between, the fiber may run on and park on a virtual
// timer, and the loop, seeing the call still in flight, turn to wait for
// the outside. The count dropping right then must not leave the loop asleep
// with nothing left to wake it: it fires the timer instead. The hooks hold
// the Blocking goroutine between the two steps until the loop is about to
// wait, then let it finish.
func TestBlockingCountDropsAsLoopIdles(t *testing.T) {
	passed, released := false, false // loop goroutine only
	proceed := make(chan struct{})   // the Blocking goroutine may drop its count
	loops := make(chan *loop, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(context.Background(), func(ctx context.Context) error {
			l := nearestLoop(ctx)
			loops <- l
			l.hookBlockingWoke = func() { <-proceed }
			l.hookIdle = func() {
				if !passed || released {
					return
				}
				released = true
				close(proceed)
				for l.blockingCount() > 0 {
					runtime.Gosched()
				}
			}
			require.NoError(t, Blocking(ctx, func() error { return nil }))
			passed = true
			return Sleep(ctx, time.Second)
		}, Virtual(time.Time{}))
	}()
	l := <-loops
	reported := false
	for {
		select {
		case err := <-done:
			require.NoError(t, err)
			return
		default:
		}
		l.mu.Lock()
		stuck := l.sleeping && l.blocking == 0 && len(l.inbox) == 0
		l.mu.Unlock()
		if stuck && !reported {
			reported = true
			assert.Fail(t, "the loop sleeps with no Blocking call in flight and a timer due")
			l.signal() // let the run end
		}
		runtime.Gosched()
	}
}

// blockingCount returns the number of Blocking calls in flight.
func (l *loop) blockingCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.blocking
}
