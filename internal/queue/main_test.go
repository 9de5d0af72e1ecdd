package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

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
