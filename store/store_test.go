package store_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPolicyValidate(t *testing.T) {
	require.NoError(t, store.Policy{Rate: 10, Burst: 10}.Validate())
	require.NoError(t, store.Policy{Rate: 0.5, Burst: 1}.Validate())
	for _, p := range []store.Policy{
		{Rate: 0, Burst: 1}, {Rate: -1, Burst: 1}, {Rate: 10, Burst: 0},
		{Rate: 1e-9, Burst: 100}, {Rate: 2e9, Burst: 1},
	} {
		assert.Error(t, p.Validate(), "%+v", p)
	}
	// A rate so small that one token's interval does not fit a Duration is
	// refused for that, not for an interval that "rounds to zero" (the
	// conversion's wrapped value).
	for _, r := range []float64{1e-10, 1e-300, 5e-324} {
		err := store.Policy{Rate: r, Burst: 1}.Validate()
		require.Error(t, err, "rate %v", r)
		assert.NotContains(t, err.Error(), "rounds to zero", "rate %v", r)
		assert.Contains(t, err.Error(), "over the", "rate %v", r)
	}
	assert.Equal(t, 100*time.Millisecond, store.Policy{Rate: 10}.Interval())
	assert.Equal(t, 2*time.Second, store.Policy{Rate: 0.5}.Interval())
	assert.Equal(t, time.Second, store.Policy{Rate: 10, Burst: 10}.Tolerance())
}

// TestIntervalRoundsUp checks Interval against the ceiling of 1s/Rate
// computed exactly, for the rates a policy is written as: n per second,
// minute, hour or day (rate n/period, as the service's rules give it), and
// decimal rates as typed on a command line. A whole T stays whole: the
// float rounding of n/period never pushes it up by a nanosecond.
func TestIntervalRoundsUp(t *testing.T) {
	// 1s/3 = 333333333.33ns: rounded up, never to the nearest (below).
	require.Equal(t, time.Duration(333333334), store.Policy{Rate: 3}.Interval())
	require.Equal(t, time.Duration(666666667), store.Policy{Rate: 1.5}.Interval())
	require.Equal(t, time.Duration(3), store.Policy{Rate: 4e8}.Interval()) // 2.5ns
	require.Equal(t, time.Duration(1), store.Policy{Rate: 1e9}.Interval())
	check := func(num, den int64, rate float64) { // exact T = num/den ns
		t.Helper()
		want := time.Duration((num + den - 1) / den)
		require.Equal(t, want, store.Policy{Rate: rate}.Interval(), "rate %v = %d/%d ns", rate, den, num)
	}
	for _, per := range []time.Duration{time.Second, time.Minute, time.Hour, 24 * time.Hour} {
		for n := int64(1); n <= 20_000; n++ {
			check(int64(per), n, float64(n)/per.Seconds())
		}
	}
	for _, scale := range []int64{1, 10, 100, 1000} {
		for k := int64(1); k <= 50_000; k++ {
			check(int64(time.Second)*scale, k, float64(k)/float64(scale))
		}
	}
}
