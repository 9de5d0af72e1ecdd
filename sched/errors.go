package sched

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

var (
	// ErrNotInLoop is returned by calls that need a loop's context when
	// given a context that belongs to no loop.
	ErrNotInLoop = errors.New("sched: context is not inside a sched.Run loop")
	// ErrNotVirtual is returned by Advance in a loop that runs on real time.
	ErrNotVirtual = errors.New("sched: Advance needs a virtual clock (sched.Virtual or sched.WithVirtualClock)")
	// errKilled unwinds a fiber that Run stops (a daemon that ignored its
	// cancellation, or every fiber after a panic or deadlock).
	errKilled = errors.New("sched: fiber stopped by its run loop")
)

// A ParkedFiber describes one fiber in a DeadlockError.
type ParkedFiber struct {
	ID     uint64
	Daemon bool
	Reason string // what it waits for, such as "semaphore.Acquire n=3"
	Site   string // file:line of the call that parked it, outside the sluice packages
}

func (p ParkedFiber) String() string {
	kind := "fiber"
	if p.Daemon {
		kind = "daemon fiber"
	}
	return fmt.Sprintf("%s %d waits on %s at %s", kind, p.ID, p.Reason, p.Site)
}

// A DeadlockError is returned by Run under a virtual clock when fibers are
// parked and nothing can ever wake them: no fiber can run, no timer is
// armed or being fired (by another goroutine advancing a WithVirtualClock
// clock), no Blocking call is in flight, and no wake has begun on its way
// (a context a fiber waits on, or an ancestor of it, ended by another
// goroutine, or by the standard library's goroutine that carries a
// wrapper's end to its child; a Wake already won; an AfterFunc callback
// still running). A goroutine that has not yet begun to cancel or wake is
// one the loop cannot know of: use Blocking for such work.
type DeadlockError struct {
	At     time.Time // the virtual time at which the loop gave up
	Parked []ParkedFiber
}

func (e *DeadlockError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "sched: deadlock at %s: %d fiber(s) parked with nothing to wake them", e.At.Format(time.RFC3339Nano), len(e.Parked))
	for _, p := range e.Parked {
		b.WriteString("\n\t")
		b.WriteString(p.String())
	}
	return b.String()
}

// A PanicError is returned by Run when a fiber panics. Run stops every other
// fiber first (their deferred calls run) and returns this error instead of
// re-panicking, so one faulty fiber cannot take a test binary down with a
// stack that hides which fiber failed.
type PanicError struct {
	Fiber uint64 // ID of the fiber that panicked
	Func  string // the fiber's function
	Value any    // the value passed to panic
	Stack []byte // the panicking fiber's stack
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("sched: fiber %d (%s) panicked: %v\n%s", e.Fiber, e.Func, e.Value, e.Stack)
}

// Unwrap returns the panic value when it is an error.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}
