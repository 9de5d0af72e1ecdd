package vclock_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/vclock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestZeroStartIsEpoch(t *testing.T) {
	c := vclock.New(time.Time{})
	assert.Equal(t, vclock.Epoch(), c.Now())
	assert.Equal(t, "2000-01-01T00:00:00Z", c.Now().Format(time.RFC3339))
}

func TestTimersFireInDeadlineThenCreationOrder(t *testing.T) {
	c := vclock.New(time.Time{})
	var got []string
	at := func(name string, d time.Duration) {
		c.AfterFunc(d, func() { got = append(got, name+"@"+c.Since(vclock.Epoch()).String()) })
	}
	at("c", 3*time.Second)
	at("a1", time.Second)
	at("b", 2*time.Second)
	at("a2", time.Second)
	at("z", 0)
	require.Equal(t, 5, c.Pending())
	next, ok := c.Next()
	require.True(t, ok)
	assert.Equal(t, vclock.Epoch(), next)

	c.Advance(2500 * time.Millisecond)
	assert.Equal(t, []string{"z@0s", "a1@1s", "a2@1s", "b@2s"}, got)
	assert.Equal(t, vclock.Epoch().Add(2500*time.Millisecond), c.Now())
	assert.Equal(t, 1, c.Pending())

	c.AdvanceTo(vclock.Epoch().Add(time.Hour))
	assert.Equal(t, []string{"z@0s", "a1@1s", "a2@1s", "b@2s", "c@3s"}, got)
	_, ok = c.Next()
	assert.False(t, ok)
}

// A callback reads the clock, adds timers (inside and beyond the window)
// and stops another: none of it deadlocks, and timers added inside the
// window fire in the same Advance.
func TestCallbacksMayReenterTheClock(t *testing.T) {
	c := vclock.New(time.Time{})
	var got []time.Duration
	var victim *vclock.Timer
	c.AfterFunc(time.Second, func() {
		got = append(got, c.Since(vclock.Epoch()))
		c.AfterFunc(time.Second, func() { got = append(got, c.Since(vclock.Epoch())) })
		c.AfterFunc(time.Hour, func() { got = append(got, c.Since(vclock.Epoch())) })
		assert.True(t, victim.Stop())
	})
	victim = c.AfterFunc(1500*time.Millisecond, func() { t.Error("stopped timer fired") })
	c.Advance(3 * time.Second)
	assert.Equal(t, []time.Duration{time.Second, 2 * time.Second}, got)
	assert.Equal(t, 1, c.Pending())
}

func TestStopAndReset(t *testing.T) {
	c := vclock.New(time.Time{})
	fired := 0
	tm := c.AfterFunc(time.Second, func() { fired++ })
	assert.True(t, tm.Stop())
	assert.False(t, tm.Stop())
	c.Advance(2 * time.Second)
	assert.Equal(t, 0, fired)

	assert.False(t, tm.Reset(time.Second), "a stopped timer was not armed")
	assert.Equal(t, vclock.Epoch().Add(3*time.Second), tm.When())
	assert.True(t, tm.Reset(2*time.Second), "re-arming an armed timer")
	c.Advance(time.Second)
	assert.Equal(t, 0, fired, "Reset moved the deadline later")
	c.Advance(time.Second)
	assert.Equal(t, 1, fired)
	assert.False(t, tm.Stop(), "already fired")
}

// Time never goes backwards: AdvanceTo a past instant keeps the time, and
// a negative Advance panics.
func TestTimeNeverGoesBackwards(t *testing.T) {
	c := vclock.New(time.Time{})
	c.Advance(time.Minute)
	c.AdvanceTo(vclock.Epoch())
	assert.Equal(t, vclock.Epoch().Add(time.Minute), c.Now())
	assert.PanicsWithValue(t, "vclock: Advance by negative duration -1ns", func() { c.Advance(-1) })
	assert.Panics(t, func() { c.AfterFunc(time.Second, nil) })
}

func TestFireNextFiresOneTimerAtATime(t *testing.T) {
	c := vclock.New(time.Time{})
	n := 0
	c.AfterFunc(time.Second, func() { n++ })
	c.AfterFunc(time.Second, func() { n++ })
	assert.False(t, c.FireNext(vclock.Epoch()), "nothing due yet")
	assert.True(t, c.FireNext(vclock.Epoch().Add(time.Second)))
	assert.Equal(t, 1, n)
	assert.Equal(t, vclock.Epoch().Add(time.Second), c.Now())
	assert.True(t, c.FireNext(vclock.Epoch().Add(time.Second)))
	assert.Equal(t, 2, n)
}

// Many goroutines arm, stop and read while one advances: clean under -race,
// and every timer either fired or was stopped.
func TestConcurrentUse(t *testing.T) {
	c := vclock.New(time.Time{})
	var mu sync.Mutex
	fired, stopped := 0, 0
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				tm := c.AfterFunc(time.Duration(i%7)*time.Millisecond, func() {
					mu.Lock()
					fired++
					mu.Unlock()
				})
				_ = c.Now()
				if i%3 == 0 && tm.Stop() {
					mu.Lock()
					stopped++
					mu.Unlock()
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 200; i++ {
			c.Advance(time.Millisecond)
		}
	}()
	wg.Wait()
	<-done
	c.Advance(time.Second)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, 8*200, fired+stopped)
	assert.Equal(t, 0, c.Pending())
}

// Thousands of timers armed in a scrambled order, some stopped, some reset,
// fire in exact (deadline, creation) order: the heap keeps its invariant.
func TestManyTimersFireInOrder(t *testing.T) {
	c := vclock.New(time.Time{})
	type key struct {
		when time.Duration
		seq  int
	}
	var fired []key
	var timers []*vclock.Timer
	for i := 0; i < 5000; i++ {
		d := time.Duration((i*7919)%1000) * time.Millisecond
		seq := i
		timers = append(timers, c.AfterFunc(d, func() { fired = append(fired, key{c.Since(vclock.Epoch()), seq}) }))
	}
	stopped := 0
	for i := 0; i < len(timers); i += 3 {
		if timers[i].Stop() {
			stopped++
		}
	}
	require.Equal(t, 5000-stopped, c.Pending())
	c.Advance(2 * time.Second)
	require.Len(t, fired, 5000-stopped)
	for i := 1; i < len(fired); i++ {
		a, b := fired[i-1], fired[i]
		require.True(t, a.when < b.when || (a.when == b.when && a.seq < b.seq), "%v before %v", a, b)
	}
}

// Advance by a d that takes the clock past the largest offset saturates
// there, as AfterFunc's deadlines do: every timer armed fires. Before,
// now + d wrapped negative and Advance fired nothing and stayed put.
func TestAdvancePastTheEndSaturates(t *testing.T) {
	c := vclock.New(time.Time{})
	c.Advance(time.Second)
	fired := 0
	c.AfterFunc(time.Hour, func() { fired++ })
	c.AfterFunc(1<<63-1, func() { fired++ }) // saturated at the largest offset
	c.Advance(1<<63 - 1)
	assert.Equal(t, 2, fired, "both timers are within the advance")
	assert.Zero(t, c.Pending())
	assert.True(t, c.Now().After(vclock.Epoch().Add(time.Hour)), "time moved forward")
}
