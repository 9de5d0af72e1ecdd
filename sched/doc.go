// Package sched is a cooperative run loop that hosts fibers: lightweight
// threads of control that run one at a time on the goroutine that called
// Run, switching only where they wait (Yield, Sleep, Fiber.Wait, Blocking,
// and the blocking calls of semaphore, ticker and ratelimiter). Runnable fibers run in FIFO order, or in a seeded order under
// WithSeed.
//
//	err := sched.Run(ctx, func(ctx context.Context) error {
//		for i := range 3 {
//			sched.Go(ctx, func(ctx context.Context) error {
//				return sched.Sleep(ctx, time.Duration(i)*time.Hour) // no real time passes
//			})
//		}
//		return nil
//	}, sched.Virtual(vclock.Epoch())) // returns once every fiber has ended
//
// The context carries the time domain. Every fiber receives a context that
// carries its loop; waits that take that context park the fiber, and time is
// the loop's clock. Under a virtual clock (Virtual, WithVirtualClock) time
// stands still while any fiber can run and jumps to the earliest deadline
// when every fiber is parked, so an hour of behaviour runs in milliseconds
// with exact, repeatable timestamps: the same program produces the same
// sequence of events on every run. Outside any loop the same calls block the
// calling goroutine and use real time, so the packages that park on the
// loop (semaphore, ticker, ratelimiter) work for fibers and plain goroutines
// alike.
//
// Cancellation lands at a fixed point of the schedule. A wait on a context
// of this package (Run's, a Daemon's, WithTimeout's, WithDeadline's) ends
// before its cancel returns. A wait on a standard context derived from one
// (context.WithCancel, WithCancelCause, WithTimeout, WithDeadline, chains
// through WithoutCancel or WithValue) ends, once cancel has returned on the
// loop's goroutine, before any other fiber runs. A cancel from another
// goroutine lands no later than the first scheduling decision after it
// returned. context.AfterFunc always runs its function on a goroutine of its
// own; use AfterFunc of this package for a callback at a fixed point of the
// schedule. A standard child of a wrapper that hides this package's
// contexts (struct{ context.Context }{ctx}, a type of your own) learns of
// its parent's end on a goroutine the standard library starts; under a
// virtual clock the loop waits for that end to land before time moves, so
// the wait on such a child still ends at the parent's virtual deadline,
// though fibers runnable at that instant may run first.
//
// What a wait costs per scheduling decision: nothing, for a wait on a
// context of this package, and for one on a standard context made directly
// from one (through WithValue wrappers only), the usual
// context.WithTimeout(ctx, d) in a fiber: such a child reports its end to
// the loop synchronously, through the AfterFunc method of its parent, and
// the wait ends there. A standard context further down a chain of standard
// contexts, or under WithoutCancel, reports its end only on a goroutine of
// its own; the loop checks each wait on such a context at every scheduling
// decision instead of waiting for that goroutine, which costs in proportion
// to those waits.
//
// # Exploring schedules
//
// FIFO is one order among the many a real scheduler could produce, and a
// bug that depends on the order (a check and an act with a wait between
// them) may never show under it. WithSeed draws the order of fibers
// runnable at the same instant, and of timers due at the same instant, from
// a seeded generator: each seed is another schedule, and the same seed is
// the same schedule, so the same trace byte for byte. Package schedtest runs
// a test under many seeds and prints the command that replays a failing one:
//
//	func TestCache(t *testing.T) {
//		schedtest.Explore(t, 1000, func(t *testing.T, seed uint64) {
//			err := sched.Run(context.Background(), func(ctx context.Context) error {
//				... start fibers, check invariants ...
//			}, sched.Virtual(time.Time{}), sched.WithSeed(seed))
//			require.NoError(t, err)
//		})
//	}
//
//	--- FAIL: TestCache/seed=37
//	schedtest: seed 37 of 1000 failed; replay it alone with
//	    SLUICE_SEED=37 go test -run '^TestCache$' ./cache
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
