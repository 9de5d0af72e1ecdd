package sched

// Waiter is the waiter type for this package's tests, which build small
// wait queues on it as the parking core does through internal/loopctx.
type Waiter = waiter
