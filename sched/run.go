package sched

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/sluice-go/sluice/internal/vwake"
	"github.com/sluice-go/sluice/vclock"
)

// An Option configures Run.
type Option func(*config)

type config struct {
	virtual *vclock.Clock
	real    clock.Clock
	seed    uint64
	seeded  bool
}

// Virtual runs the loop on a new virtual clock reading start (a zero start
// means vclock.Epoch()). Time stands still while any fiber can run or a
// Blocking call is in flight, and jumps to the earliest deadline otherwise.
func Virtual(start time.Time) Option {
	return func(c *config) { c.virtual, c.real = vclock.New(start), nil }
}

// WithVirtualClock is Virtual with a clock the caller keeps, to read it or
// advance it by hand. A clock should serve one loop at a time. A timer that
// another goroutine's Advance has taken off the clock's queue counts, until
// its callback or wake returns, as one that can still wake a fiber: the
// loop waits for it rather than reporting a deadlock.
func WithVirtualClock(vc *vclock.Clock) Option {
	if vc == nil {
		panic("sched: WithVirtualClock(nil)")
	}
	return func(c *config) { c.virtual, c.real = vc, nil }
}

// WithClock runs the loop on real time read from rc (the default is
// clock.New(); a *clock.Mock serves tests that drive time by hand).
func WithClock(rc clock.Clock) Option {
	if rc == nil {
		panic("sched: WithClock(nil)")
	}
	return func(c *config) { c.real, c.virtual = rc, nil }
}

// WithSeed explores one schedule of the program among all those a real
// scheduler could produce: fibers runnable at the same instant run in an
// order drawn from a PCG generator (math/rand/v2) seeded with seed, instead
// of FIFO, and under a virtual clock timers due at the same instant fire in
// a seeded order too, instead of creation order. The same seed gives the
// same schedule (with the same code and Go release), so the same trace byte
// for byte for a program whose only nondeterminism is the schedule: a
// failing seed replays exactly. Yield
// remains a scheduling point but no longer promises that every other fiber
// runs first. Timers armed on a WithVirtualClock clock during the run take
// their ties from the seed too. Without WithSeed the order is FIFO. See
// package schedtest for running a test under many seeds.
func WithSeed(seed uint64) Option {
	return func(c *config) { c.seed, c.seeded = seed, true }
}

// Run runs main in a new fiber of a new loop on the calling goroutine and
// returns when main and every non-daemon fiber it started have ended; daemon
// fibers still alive then are cancelled and finish first.
//
// It returns main's error, joined with the errors of fibers that nobody
// collected with Fiber.Wait. It returns a *PanicError if a fiber panics, and,
// under a virtual clock, a *DeadlockError when fibers are parked that nothing
// can wake; in both cases every remaining fiber is stopped first (their
// deferred calls run). If a fiber calls runtime.Goexit (t.Fatal, t.FailNow),
// the goroutine that called Run exits too, after Run has stopped every
// fiber, just as if the call had been made on that goroutine.
//
// main receives ctx with the loop added: it is done when ctx is (and once
// Run has returned), and the contexts of all fibers derive from it.
// Cancelling ctx cancels them all. Under a real clock the loop waits for
// wakes from other goroutines and cannot prove a deadlock.
func Run(ctx context.Context, main func(ctx context.Context) error, opts ...Option) error {
	if main == nil {
		return errors.New("sched: Run with a nil main func")
	}
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	l := newLoop(cfg)
	if l.virtual != nil {
		// Timers that another goroutine fires (a WithVirtualClock clock
		// advanced by hand) can still wake fibers while no timer is armed;
		// the loop waits for them instead of reporting a deadlock.
		l.firing = vwake.Watch(l.virtual, l.fireEnded)
		defer vwake.Watch(l.virtual, nil)
	}
	if cfg.seeded && l.virtual != nil {
		ties := rand.NewPCG(cfg.seed, 0x71e5).Uint64
		l.virtual.SetTieBreaker(ties)
		defer l.virtual.SetTieBreaker(nil)
	}
	root := newLoopCtx(ctx, l)
	root.neverDone = ctx.Done() == nil
	defer l.shutdown(root)
	mainFiber := l.spawn(root, main, false)
	l.run()
	if l.failure != nil {
		return l.failure
	}
	var errs []error
	if mainFiber.err != nil {
		errs = append(errs, mainFiber.err)
	}
	for _, f := range l.failed {
		f.mu.Lock()
		if !f.waited && f != mainFiber {
			errs = append(errs, f.err)
		}
		f.mu.Unlock()
	}
	if len(errs) == 1 {
		return errs[0] // main's error as it is, for == and errors.Is alike
	}
	return errors.Join(errs...)
}
