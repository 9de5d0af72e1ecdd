package vclock_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/sluice-go/sluice/vclock"
)

// A tie-breaker orders timers of equal deadline by the values it returns,
// never across deadlines; equal values keep creation order; nil restores
// creation order; a re-armed timer draws a new value.
func TestTieBreakerOrdersEqualDeadlinesOnly(t *testing.T) {
	c := vclock.New(time.Time{})
	ties := []uint64{5, 1, 9, 1, 0, 7}
	c.SetTieBreaker(func() uint64 { v := ties[0]; ties = ties[1:]; return v })
	var got []string
	at := func(name string, d time.Duration) *vclock.Timer {
		return c.AfterFunc(d, func() { got = append(got, name) })
	}
	at("a", time.Second)          // tie 5
	at("b", time.Second)          // tie 1
	at("early", time.Millisecond) // tie 9, but earlier
	at("c", time.Second)          // tie 1, after b
	d := at("d", time.Second)     // tie 0
	d.Reset(time.Second)          // tie 7: now last
	c.SetTieBreaker(nil)
	at("e", time.Second) // tie 0, created last: before every drawn tie
	c.Advance(time.Second)
	assert.Equal(t, []string{"early", "e", "b", "c", "a", "d"}, got)
}
