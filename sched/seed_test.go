package sched_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/sched"
)

// cancelProgram adds standard-context cancellations to program: fibers
// wait in a queue on context.WithCancel contexts that other fibers cancel,
// so the trace also depends on where those cancels land.
func cancelProgram(tr *trace) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		var q waitQueue
		for i := range 10 {
			wctx, cancel := context.WithCancel(ctx)
			sched.Go(ctx, func(ctx context.Context) error {
				err := q.wait(wctx)
				tr.add(ctx, "waiter %d: %v", i, err)
				return nil
			})
			sched.Go(ctx, func(ctx context.Context) error {
				_ = sched.Sleep(ctx, time.Duration(i%3)*time.Millisecond)
				if i%2 == 0 {
					cancel()
					tr.add(ctx, "cancelled %d", i)
				} else {
					tr.add(ctx, "woke one: %v", q.wakeHead())
					cancel()
				}
				return nil
			})
		}
		return program(tr)(ctx)
	}
}

func seededTrace(t *testing.T, seed uint64) string {
	var tr trace
	require.NoError(t, sched.Run(context.Background(), cancelProgram(&tr),
		sched.Virtual(time.Time{}), sched.WithSeed(seed)))
	return strings.Join(tr.get(), "\n")
}

// The same seed gives the same trace byte for byte; different seeds give
// different schedules of the same program.
func TestSameSeedSameTrace(t *testing.T) {
	distinct := map[string]bool{}
	for seed := range uint64(40) {
		first := seededTrace(t, seed)
		for range 3 {
			require.Equal(t, first, seededTrace(t, seed), "seed %d", seed)
		}
		distinct[first] = true
	}
	assert.Greater(t, len(distinct), 30, "40 seeds explored only %d schedules", len(distinct))
}

// Without WithSeed the order stays FIFO, run after run.
func TestWithoutSeedTheTraceIsFIFO(t *testing.T) {
	var first trace
	require.NoError(t, runV(cancelProgram(&first)))
	for range 20 {
		var tr trace
		require.NoError(t, runV(cancelProgram(&tr)))
		require.Equal(t, first.get(), tr.get())
	}
}

// wakeOrder starts fibers that all sleep until the same instant, and
// returns the order in which they woke; with kind "timer" each wake is a
// timer of its own, with kind "yield" they are runnable together.
func wakeOrder(t *testing.T, opts ...sched.Option) []int {
	var order []int
	require.NoError(t, sched.Run(context.Background(), func(ctx context.Context) error {
		for i := range 8 {
			sched.Go(ctx, func(ctx context.Context) error {
				if err := sched.Sleep(ctx, time.Second); err != nil {
					return err
				}
				order = append(order, i)
				return nil
			})
		}
		return nil
	}, append(opts, sched.Virtual(time.Time{}))...))
	return order
}

// Timers due at the same instant fire in creation order by default, and in
// a seeded order under WithSeed: every order a permutation, the same for
// the same seed.
func TestSeedOrdersSameInstantTimers(t *testing.T) {
	assert.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7}, wakeOrder(t))
	orders := map[string]bool{}
	for seed := range uint64(20) {
		o := wakeOrder(t, sched.WithSeed(seed))
		assert.Equal(t, o, wakeOrder(t, sched.WithSeed(seed)), "seed %d", seed)
		sorted := slices.Clone(o)
		slices.Sort(sorted)
		require.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7}, sorted, "seed %d lost or doubled a wake", seed)
		orders[fmt.Sprint(o)] = true
	}
	assert.Greater(t, len(orders), 15)
}

// Fibers runnable at the same instant run in a seeded order.
func TestSeedOrdersRunnableFibers(t *testing.T) {
	run := func(opts ...sched.Option) []int {
		var order []int
		require.NoError(t, sched.Run(context.Background(), func(ctx context.Context) error {
			for i := range 6 {
				sched.Go(ctx, func(context.Context) error { order = append(order, i); return nil })
			}
			return nil
		}, opts...))
		return order
	}
	assert.Equal(t, []int{0, 1, 2, 3, 4, 5}, run())
	orders := map[string]bool{}
	for seed := range uint64(20) {
		o := run(sched.WithSeed(seed))
		assert.Equal(t, o, run(sched.WithSeed(seed)))
		orders[fmt.Sprint(o)] = true
	}
	assert.Greater(t, len(orders), 15)
}
