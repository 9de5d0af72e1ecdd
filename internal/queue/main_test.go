package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/loopctx"
	"github.com/sluice-go/sluice/sched"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// run runs main in a loop on a virtual clock.
func run(t *testing.T, main func(ctx context.Context) error) {
	t.Helper()
	require.NoError(t, sched.Run(context.Background(), main, sched.Virtual(time.Time{})))
}

// settle lets every fiber woken so far run before the caller goes on.
func settle(ctx context.Context) { sched.Yield(ctx) }

// mockClock is a clock for a test's Source whose alarm must never fire by
// itself: the test drives the Source by hand.
func mockClock() loopctx.Clock { return loopctx.Real(clock.NewMock()) }
