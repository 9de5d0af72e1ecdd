package gcra_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/gcra"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStepAndFigures(t *testing.T) {
	const T, tau = 100, 300 // burst 3
	type step struct {
		now, cost     int64
		allowed       bool
		tat           int64 // stored after the step
		remaining     float64
		retry, resetA time.Duration
	}
	steps := []step{
		{now: 1000, cost: 1, allowed: true, tat: 1100, remaining: 2, resetA: 100},
		{now: 1000, cost: 2, allowed: true, tat: 1300, remaining: 0, resetA: 300},
		{now: 1000, cost: 1, allowed: false, tat: 1300, remaining: 0, retry: 100, resetA: 300},
		{now: 1030, cost: 1, allowed: false, tat: 1300, remaining: 0.3, retry: 70, resetA: 270},
		{now: 1100, cost: 1, allowed: true, tat: 1400, remaining: 0, resetA: 300},
		{now: 1250, cost: 2, allowed: false, tat: 1400, remaining: 1.5, retry: 50, resetA: 150},
		{now: 1300, cost: 2, allowed: true, tat: 1600, remaining: 0, resetA: 300},
		// Idle far past full: a bucket never holds more than burst.
		{now: 9000, cost: 3, allowed: true, tat: 9300, remaining: 0, resetA: 300},
		{now: 9300, cost: 3, allowed: true, tat: 9600, remaining: 0, resetA: 300},
	}
	tat := int64(0)
	for i, s := range steps {
		next, ok := gcra.Step(tat, s.now, s.cost*T, tau-s.cost*T)
		r := gcra.Figures(ok, next-s.now, s.cost*T, T, tau)
		require.Equal(t, s.allowed, ok, "step %d", i)
		require.Equal(t, ok, r.Allowed, "step %d", i)
		if ok {
			tat = next
		}
		assert.Equal(t, s.tat, tat, "step %d tat", i)
		assert.InDelta(t, s.remaining, r.Remaining, 1e-9, "step %d remaining", i)
		assert.Equal(t, s.retry, r.RetryAfter, "step %d retry", i)
		assert.Equal(t, s.resetA, r.ResetAfter, "step %d reset", i)
	}
}

// TestStepWindowBound checks b + (e−s)/T exactly over every window of a
// saturating request stream at irregular times.
func TestStepWindowBound(t *testing.T) {
	const T, b = 7, 4
	var admitted []int64
	tat := int64(0)
	now := int64(0)
	for i := range 5000 {
		now += int64(i * 13 % 11) // irregular, sometimes zero, steps
		if next, ok := gcra.Step(tat, now, T, T*b-T); ok {
			admitted = append(admitted, now)
			tat = next
		}
	}
	for i := range admitted {
		for j := i; j < len(admitted); j++ {
			if span := admitted[j] - admitted[i]; int64(j-i+1) > b+span/T {
				t.Fatalf("window [%d,%d] admitted %d > b + span/T = %d", admitted[i], admitted[j], j-i+1, b+span/T)
			}
		}
	}
	assert.Greater(t, len(admitted), 1000)
}

// TestStepDamagedTAT: a TAT no writer could have stored (far ahead, or the
// extremes of int64) is a denial, with no overflow in the debt.
func TestStepDamagedTAT(t *testing.T) {
	const T, tau, now = 100, 300, int64(1) << 40
	for _, tat := range []int64{math.MaxInt64, math.MaxInt64 - 1, now + tau + 1} {
		next, ok := gcra.Step(tat, now, T, tau-T)
		assert.False(t, ok, "tat %d", tat)
		assert.Equal(t, tat-now, next-now, "tat %d: the debt", tat)
		assert.Equal(t, tat-now, gcra.Debt(tat, now))
	}
	next, ok := gcra.Step(math.MinInt64, now, T, tau-T)
	assert.True(t, ok, "a TAT far behind is a full bucket")
	assert.Equal(t, now+T, next)
	assert.Zero(t, gcra.Debt(math.MinInt64, now))
}
