package sched

import (
	"context"
	"fmt"
	"runtime/debug"
)

// Blocking runs fn, which may block for real (I/O, a syscall, a channel fed
// by another goroutine), on a goroutine of its own while the calling fiber
// parks and the loop runs other fibers. Virtual time does not move while any
// Blocking call is in flight. Blocking returns fn's error once fn returns;
// it does not abandon fn when ctx ends (fn should watch ctx itself). A panic
// in fn is re-raised in the calling fiber. Outside a loop it simply calls fn.
func Blocking(ctx context.Context, fn func() error) error {
	if fn == nil {
		panic("sched: Blocking with a nil func")
	}
	l := nearestLoop(ctx)
	if l == nil {
		return fn()
	}
	var (
		w     = &waiter{Reason: "sched.Blocking"}
		err   error
		pval  any
		stack []byte
	)
	// fn's run is not cancellable, so neither is the wait for it.
	wctx := context.WithoutCancel(ctx)
	w.Prepare(wctx)
	l.mu.Lock()
	l.blocking++
	l.nblocking.Store(int32(l.blocking))
	l.mu.Unlock()
	go func() {
		defer func() {
			if r := recover(); r != nil {
				pval, stack = r, debug.Stack()
			}
			// Wake before the count drops, so the loop never sees neither
			// a Blocking call in flight nor the fiber it woke.
			w.Wake()
			if l.hookBlockingWoke != nil {
				l.hookBlockingWoke()
			}
			l.mu.Lock()
			l.blocking--
			l.nblocking.Store(int32(l.blocking))
			sleeping := l.sleeping
			l.mu.Unlock()
			if sleeping {
				l.signal()
			}
		}()
		err = fn()
	}()
	_ = w.Wait(wctx) // cannot fail: the context never ends
	if pval != nil {
		panic(fmt.Sprintf("sched: panic in Blocking func: %v\n%s", pval, stack))
	}
	return err
}
