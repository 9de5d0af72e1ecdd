package vclock_test

import (
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
