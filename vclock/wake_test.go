package vclock_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/vwake"
	"github.com/sluice-go/sluice/vclock"
)

// wakeLog is a vwake.Waker that records its wakes by name.
type wakeLog struct {
	name string
	got  *[]string
}

func (w wakeLog) Wake() bool { *w.got = append(*w.got, w.name); return true }

// A timer bound by vwake.Bind fires as an AfterFunc timer does: armed by
// Reset, in (deadline, arming order) among AfterFunc timers, at its own
// deadline, stopped by Stop; its fire calls the waker instead of a func.
func TestBoundTimerFiresInArmingOrder(t *testing.T) {
	c := vclock.New(time.Time{})
	var got []string
	var b1, b2 vclock.Timer
	vwake.Bind(&b1, c, wakeLog{"b1", &got})
	vwake.Bind(&b2, c, wakeLog{"b2", &got})

	c.AfterFunc(time.Second, func() { got = append(got, "f1") })
	assert.False(t, b1.Reset(time.Second))
	c.AfterFunc(time.Second, func() { got = append(got, "f2") })
	assert.False(t, b2.Reset(time.Second))
	c.AfterFunc(time.Second, func() { got = append(got, "f3") })
	assert.True(t, b2.Reset(time.Second)) // re-armed: now last
	require.Equal(t, 5, c.Pending())

	c.Advance(time.Second)
	assert.Equal(t, []string{"f1", "b1", "f2", "f3", "b2"}, got)
	assert.Equal(t, vclock.Epoch().Add(time.Second), b1.When())

	got = nil
	b1.Reset(time.Second)
	assert.True(t, b1.Stop())
	assert.False(t, b1.Stop())
	c.Advance(time.Hour)
	assert.Empty(t, got)
	assert.Zero(t, c.Pending())
}

// vwake.Watch's count covers each fire from the moment its timer leaves
// the queue until its callback or Wake has returned, nested fires
// included; ended runs each time the count drops to zero, after the
// fire's work, and a callback that panics still drops the count.
func TestWatchCountsFiresInFlight(t *testing.T) {
	c := vclock.New(time.Time{})
	var log []string
	firing := vwake.Watch(c, func() { log = append(log, "ended") })
	defer vwake.Watch(c, nil)
	require.Zero(t, firing.Load())

	var bound vclock.Timer
	vwake.Bind(&bound, c, wakerFunc(func() {
		log = append(log, fmt.Sprintf("wake pending=%d firing=%d", c.Pending(), firing.Load()))
	}))
	c.AfterFunc(time.Second, func() {
		log = append(log, fmt.Sprintf("outer pending=%d firing=%d", c.Pending(), firing.Load()))
		bound.Reset(0)
		c.Advance(0) // a nested fire
		log = append(log, fmt.Sprintf("outer again firing=%d", firing.Load()))
	})
	c.Advance(time.Second)
	assert.Equal(t, []string{
		"outer pending=0 firing=1",
		"wake pending=0 firing=2",
		"outer again firing=1",
		"ended",
	}, log)
	assert.Zero(t, firing.Load())

	log = nil
	c.AfterFunc(0, func() { panic("boom") })
	assert.PanicsWithValue(t, "boom", func() { c.Advance(0) })
	assert.Zero(t, firing.Load())
	assert.Equal(t, []string{"ended"}, log)

	vwake.Watch(c, nil)
	log = nil
	c.AfterFunc(0, func() {})
	c.Advance(0)
	assert.Empty(t, log, "no watcher: nothing runs")
}

// wakerFunc is a vwake.Waker that calls itself.
type wakerFunc func()

func (f wakerFunc) Wake() bool { f(); return true }
