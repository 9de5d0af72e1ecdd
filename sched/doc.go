// Package sched is a cooperative run loop that hosts fibers: lightweight
// threads of control that run one at a time on the goroutine that called
// Run, switching only where they wait (Yield, Sleep, a Waiter, Fiber.Wait,
// Blocking). Runnable fibers run in FIFO order.
//
// The context carries the time domain. Every fiber receives a context that
// carries its loop; waits that take that context park the fiber, and time is
// the loop's clock. Under a virtual clock (Virtual, WithVirtualClock) time
// stands still while any fiber can run and jumps to the earliest deadline
// when every fiber is parked, so an hour of behaviour runs in milliseconds
// with exact, repeatable timestamps: the same program produces the same
// sequence of events on every run. Outside any loop the same calls block the
// calling goroutine and use real time, so packages built on Waiter (semaphore,
// ticker, ratelimiter) work for fibers and plain goroutines alike.
//
// A context of a loop belongs to that loop's fibers: passing it to another
// goroutine and blocking on it there (other than through the standard
// context methods) is misuse; such goroutines should wait with a context of
// their own.
//
// Fibers are runtime coroutines (iter.Pull): a switch costs about as much as
// runtime.Gosched. A fiber that blocks for real (a channel, a mutex held by a
// parked fiber, I/O) blocks the whole loop; run such work with Blocking.
package sched
