package loopctx_test

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/loopctx"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// This test binary does not link sched: no context belongs to a loop, and
// the clock is the fallback's.
func TestWithoutSched(t *testing.T) {
	ctx := context.Background()
	assert.False(t, loopctx.InLoop(ctx))
	assert.Nil(t, loopctx.AfterRun(ctx, func() { t.Error("ran") }))

	mock := clock.NewMock()
	c := loopctx.ClockOf(ctx, mock)
	assert.Equal(t, mock.Now(), c.Now())
	fired := make(chan struct{})
	c.AfterFunc(time.Second, func() { close(fired) })
	mock.Add(time.Second)
	<-fired // the mock's timer, on its goroutine
	assert.NotNil(t, loopctx.ClockOf(ctx, nil))
}
