package store_test

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDecideSteps(t *testing.T) {
	const T, tau = 100, 300 // 10 tokens per µs-ish unit: burst 3
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
		next, r := store.Decide(tat, s.now, s.cost, T, tau)
		require.Equal(t, s.allowed, r.Allowed, "step %d", i)
		assert.Equal(t, s.tat, next, "step %d tat", i)
		assert.InDelta(t, s.remaining, r.Remaining, 1e-9, "step %d remaining", i)
		assert.Equal(t, s.retry, r.RetryAfter, "step %d retry", i)
		assert.Equal(t, s.resetA, r.ResetAfter, "step %d reset", i)
		tat = next
	}
}

// TestDecideWindowBound checks b + (e−s)/T exactly over every window of a
// saturating request stream at irregular times.
func TestDecideWindowBound(t *testing.T) {
	const T, b = 7, 4
	var admitted []int64
	tat := int64(0)
	now := int64(0)
	for i := range 5000 {
		now += int64(i*13%11) + 0 // irregular, sometimes zero, steps
		next, r := store.Decide(tat, now, 1, T, T*b)
		if r.Allowed {
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

func TestPolicyValidate(t *testing.T) {
	require.NoError(t, store.Policy{Rate: 10, Burst: 10}.Validate())
	require.NoError(t, store.Policy{Rate: 0.5, Burst: 1}.Validate())
	for _, p := range []store.Policy{
		{Rate: 0, Burst: 1}, {Rate: -1, Burst: 1}, {Rate: 10, Burst: 0},
		{Rate: 1e-9, Burst: 100}, {Rate: 2e9, Burst: 1},
	} {
		assert.Error(t, p.Validate(), "%+v", p)
	}
	assert.Equal(t, 100*time.Millisecond, store.Policy{Rate: 10}.Interval())
	assert.Equal(t, 2*time.Second, store.Policy{Rate: 0.5}.Interval())
	assert.Equal(t, time.Second, store.Policy{Rate: 10, Burst: 10}.Tolerance())
}

// TestIntervalRoundsHalvesAway checks Interval's Floor(x + 0.5) against
// math.Round over the rates a valid policy may have, ties included.
func TestIntervalRoundsHalvesAway(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	rates := []float64{1e9, 999_999_999, 2, 1.5, 1, 0.5, 1e-3, 4e8 / 3, 1e9 / 2.5}
	for range 100_000 {
		rates = append(rates, math.Exp(rng.Float64()*math.Log(1e9/1e-4))*1e-4) // 1e-4 … 1e9, log-uniform
	}
	for _, r := range rates {
		want := time.Duration(math.Round(float64(time.Second) / r))
		require.Equal(t, want, store.Policy{Rate: r}.Interval(), "rate %v", r)
	}
	// 2e9/5 per second is 2.5 ns per token: a tie, rounded away from zero.
	require.Equal(t, time.Duration(3), store.Policy{Rate: 4e8}.Interval())
}
