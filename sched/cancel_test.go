package sched_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/sched"
)

// waitQueue is the smallest FIFO wait queue built on sched.Waiter, as the
// semaphore is: a cancelled wait takes itself out in OnCancel.
type waitQueue struct {
	mu sync.Mutex
	ws []*sched.Waiter
}

func (q *waitQueue) wait(ctx context.Context) error {
	w := &sched.Waiter{Reason: "waitQueue"}
	w.OnCancel = func() { q.remove(w) }
	w.Prepare(ctx)
	q.mu.Lock()
	q.ws = append(q.ws, w)
	q.mu.Unlock()
	return w.Wait(ctx)
}

func (q *waitQueue) remove(w *sched.Waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, o := range q.ws {
		if o == w {
			q.ws = append(q.ws[:i], q.ws[i+1:]...)
			return
		}
	}
}

// wakeHead wakes the head waiter, skipping cancelled ones, and reports
// whether it woke one.
func (q *waitQueue) wakeHead() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.ws) > 0 {
		w := q.ws[0]
		q.ws = q.ws[1:]
		if w.Wake() {
			return true
		}
	}
	return false
}

func (q *waitQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.ws)
}

type ctxKind struct {
	name string
	// make returns the context a fiber waits on and the function that ends
	// it, both derived from the fiber context ctx.
	make func(ctx context.Context) (wait context.Context, cancel func())
}

type kindKey struct{}

var errCause = errors.New("cause")

// ctxKinds are the context chains over a loop context whose cancellation
// must land deterministically.
var ctxKinds = []ctxKind{
	{"WithCancel", func(ctx context.Context) (context.Context, func()) {
		return context.WithCancel(ctx)
	}},
	{"WithCancelCause", func(ctx context.Context) (context.Context, func()) {
		c, cancel := context.WithCancelCause(ctx)
		return c, func() { cancel(errCause) }
	}},
	{"WithTimeout", func(ctx context.Context) (context.Context, func()) {
		return context.WithTimeout(ctx, time.Hour)
	}},
	{"WithDeadline", func(ctx context.Context) (context.Context, func()) {
		return context.WithDeadline(ctx, time.Now().Add(time.Hour))
	}},
	{"WithoutCancel/WithCancel", func(ctx context.Context) (context.Context, func()) {
		return context.WithCancel(context.WithoutCancel(ctx))
	}},
	{"inner of WithCancel/WithValue/WithTimeout", func(ctx context.Context) (context.Context, func()) {
		a, cancelA := context.WithCancel(ctx)
		c, cancel := context.WithTimeout(context.WithValue(a, kindKey{}, 1), time.Hour)
		return c, func() { cancel(); cancelA() }
	}},
	{"outer of WithCancel/WithValue/WithCancel", func(ctx context.Context) (context.Context, func()) {
		a, cancel := context.WithCancel(ctx)
		c, cancelC := context.WithCancel(context.WithValue(a, kindKey{}, 1))
		return c, func() { cancel(); cancelC() } // cancelC is a no-op by then
	}},
	{"sched.WithTimeout", func(ctx context.Context) (context.Context, func()) {
		return sched.WithTimeout(ctx, time.Hour)
	}},
	{"sched.WithTimeout over WithCancel", func(ctx context.Context) (context.Context, func()) {
		a, cancel := context.WithCancel(ctx)
		c, cancelC := sched.WithTimeout(a, time.Hour)
		return c, func() { cancel(); cancelC() }
	}},
	{"WithCancel over sched.WithTimeout over WithoutCancel/WithCancel", func(ctx context.Context) (context.Context, func()) {
		a, cancel := context.WithCancel(context.WithoutCancel(ctx))
		s, cancelS := sched.WithTimeout(a, time.Hour)
		c, cancelC := context.WithCancel(s)
		return c, func() { cancel(); cancelS(); cancelC() }
	}},
	{"sched.AfterFunc from WithCancel", func(ctx context.Context) (context.Context, func()) {
		trigger, cancel := context.WithCancel(ctx)
		c, end := context.WithCancel(context.WithoutCancel(ctx))
		sched.AfterFunc(trigger, end)
		return c, cancel
	}},
	{"sched.AfterFunc from sched.WithTimeout", func(ctx context.Context) (context.Context, func()) {
		trigger, cancel := sched.WithTimeout(ctx, time.Hour)
		c, end := context.WithCancelCause(context.WithoutCancel(ctx))
		sched.AfterFunc(trigger, func() { end(errCause) })
		return c, cancel
	}},
}

// load keeps a goroutine busy while a test runs, competing with the loop
// and with the goroutines the standard library starts, so that those run
// late or early.
func load(t *testing.T) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range max(1, runtime.GOMAXPROCS(0)-1) {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					runtime.Gosched()
				}
			}
		})
	}
	t.Cleanup(func() { close(stop); wg.Wait() })
}

// cancelScenario is the reported program: a fiber parks on a context of
// kind k, a second one parks behind it on the loop context, busy fibers run
// alongside, and a fiber ends the first wait with cancel (on the loop, or
// from a plain goroutine through Blocking). From the first scheduling
// decision after cancel returned, the cancelled wait must be out of the
// queue: a fiber that was already runnable sees it gone, and one wake then
// reaches the second waiter.
func cancelScenario(t *testing.T, k ctxKind, fromGoroutine bool) {
	var q waitQueue
	err := runV(func(ctx context.Context) error {
		wctx, cancel := k.make(ctx)
		first := sched.Go(ctx, func(context.Context) error { return q.wait(wctx) })
		second := sched.Go(ctx, func(ctx context.Context) error { return q.wait(ctx) })
		for range 2 {
			sched.Go(ctx, func(ctx context.Context) error {
				for range 4 {
					sched.Yield(ctx)
				}
				return nil
			})
		}
		sched.Yield(ctx) // both parked
		if q.len() != 2 {
			return fmt.Errorf("%d waiting before cancel, want 2", q.len())
		}
		seen := 1
		var checker *sched.Fiber
		if fromGoroutine {
			if err := sched.Blocking(ctx, func() error { cancel(); return nil }); err != nil {
				return err
			}
			if n := q.len(); n != 1 {
				return fmt.Errorf("%d waiting when Blocking returned, want 1", n)
			}
		} else {
			checker = sched.Go(ctx, func(context.Context) error { seen = q.len(); return nil })
			cancel()
		}
		for range 3 {
			sched.Yield(ctx)
		}
		if checker != nil {
			if err := checker.Wait(ctx); err != nil {
				return err
			}
		}
		if seen != 1 {
			return fmt.Errorf("a fiber runnable at cancel saw %d waiting, want 1", seen)
		}
		if !q.wakeHead() {
			return errors.New("no waiter left to wake")
		}
		if err := second.Wait(ctx); err != nil {
			return fmt.Errorf("second waiter: %w", err)
		}
		err := first.Wait(ctx)
		if err == nil || err != wctx.Err() {
			return fmt.Errorf("cancelled waiter returned %v, want %v", err, wctx.Err())
		}
		return nil
	})
	require.NoError(t, err, k.name)
}

// A cancel made on the loop ends the wait before any other fiber runs, for
// every context kind, in 1,000 runs each under load: the waiter on a
// standard context leaves the queue at the cancel's scheduling decision,
// whenever the goroutine of context.AfterFunc happens to run.
func TestCancelLandsBeforeAnyOtherFiberRuns(t *testing.T) {
	everyKind(t, 1000, false)
}

// A cancel from a plain goroutine lands at the first scheduling decision
// after it returned: here, before the fiber that waited for that goroutine
// resumes.
func TestCancelFromAGoroutineLandsAtTheNextDecision(t *testing.T) {
	everyKind(t, 200, true)
}

// everyKind runs cancelScenario runs times for each context kind under
// load (a tenth as many with -short).
func everyKind(t *testing.T, runs int, fromGoroutine bool) {
	load(t)
	if testing.Short() {
		runs /= 10
	}
	for _, k := range ctxKinds {
		t.Run(k.name, func(t *testing.T) {
			for range runs {
				cancelScenario(t, k, fromGoroutine)
			}
		})
	}
}

// Cancelling a standard context made directly from a context of this
// package (Run's own, or a WithTimeout's) ends waits on it, and on its
// descendants, before cancel returns: the same fiber can cancel and then
// wake the next waiter at once.
func TestCancelOfADirectChildLandsBeforeCancelReturns(t *testing.T) {
	for _, parent := range []string{"Run", "sched.WithTimeout"} {
		t.Run(parent, func(t *testing.T) {
			var q waitQueue
			require.NoError(t, runV(func(ctx context.Context) error {
				if parent != "Run" {
					lctx, cancel := sched.WithTimeout(ctx, time.Hour)
					defer cancel()
					ctx = lctx
				}
				c, cancel := context.WithCancel(ctx)
				d, cancelD := context.WithTimeout(c, time.Hour)
				defer cancelD()
				sched.Go(ctx, func(context.Context) error { _ = q.wait(c); return nil })
				sched.Go(ctx, func(context.Context) error { _ = q.wait(d); return nil })
				third := sched.Go(ctx, func(ctx context.Context) error { return q.wait(ctx) })
				sched.Yield(ctx)
				require.Equal(t, 3, q.len())
				cancel()
				assert.Equal(t, 1, q.len())
				assert.True(t, q.wakeHead())
				return third.Wait(ctx)
			}))
		})
	}
}

func TestAfterFuncStopAndOutsideALoop(t *testing.T) {
	require.NoError(t, runV(func(ctx context.Context) error {
		c, cancel := context.WithCancel(ctx)
		ran := 0
		stop := sched.AfterFunc(c, func() { ran++ })
		assert.True(t, stop(), "stopped before it ran")
		assert.False(t, stop(), "stopped twice")
		stop2 := sched.AfterFunc(c, func() { ran += 10 })
		cancel()
		sched.Yield(ctx)
		assert.Equal(t, 10, ran)
		assert.False(t, stop2(), "stop after f started")
		// Already done: f runs at the next decision.
		sched.AfterFunc(c, func() { ran += 100 })
		sched.Yield(ctx)
		assert.Equal(t, 110, ran)
		return nil
	}))
	c, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	sched.AfterFunc(c, func() { close(done) })
	cancel()
	<-done
}

// checkedCtx counts the calls that look at whether a context has ended.
type checkedCtx struct {
	context.Context
	checks *atomic.Int64
}

func (c checkedCtx) Err() error {
	c.checks.Add(1)
	return c.Context.Err()
}

func (c checkedCtx) Done() <-chan struct{} {
	c.checks.Add(1)
	return c.Context.Done()
}

// A wait on a standard context made from a loop context costs nothing per
// scheduling decision: with 500 such waits parked, 200 decisions look at
// none of their contexts; each wait looks at its own a bounded number of
// times, and its cancel still lands before cancel returns.
func TestStandardWaitsAreNotCheckedPerDecision(t *testing.T) {
	const waits, decisions = 500, 200
	var checks atomic.Int64
	var q waitQueue
	require.NoError(t, runV(func(ctx context.Context) error {
		cancels := make([]context.CancelFunc, waits)
		fibers := make([]*sched.Fiber, waits)
		for i := range waits {
			wctx, cancel := context.WithTimeout(ctx, time.Hour)
			cancels[i] = cancel
			c := checkedCtx{wctx, &checks}
			fibers[i] = sched.Go(ctx, func(context.Context) error { return q.wait(c) })
		}
		sched.Yield(ctx) // all parked
		require.Equal(t, waits, q.len())
		parked := checks.Load()
		for range decisions {
			sched.Yield(ctx)
		}
		assert.Equal(t, parked, checks.Load(), "contexts looked at while nothing ended")
		for i, cancel := range cancels {
			cancel()
			require.Equal(t, waits-i-1, q.len(), "a cancel that had not landed when it returned")
		}
		for _, f := range fibers {
			require.ErrorIs(t, f.Wait(ctx), context.Canceled)
		}
		return nil
	}))
	assert.LessOrEqual(t, checks.Load(), int64(8*waits), "checks per wait")
}
