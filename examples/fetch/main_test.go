package main

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestZeroTooManyRequests runs the example for real (loopback HTTP, real
// time) at 50/s so that it takes about a second: every one of the 50
// fetches is answered 200, and the limiter's schedule holds: the k-th fetch
// (0-based, in sending order) went out no earlier than (k−burst+1)/rate.
// The client's burst is 8 tokens under the server's: at 50/s that absorbs
// 160ms of network jitter, plenty even on a loaded CI machine under -race.
func TestZeroTooManyRequests(t *testing.T) {
	cfg := Config{Rate: 50, ServerBurst: 10, ClientBurst: 2, Fetches: 50}
	rep, err := Run(context.Background(), cfg)
	require.NoError(t, err)
	assert.Equal(t, 0, rep.TooMany)
	assert.Equal(t, 50, rep.OK)
	require.Len(t, rep.Fetches, 50)
	interval := time.Second / 50
	for k, f := range rep.Fetches {
		assert.Equal(t, http.StatusOK, f.Status)
		if k >= cfg.ClientBurst {
			assert.GreaterOrEqual(t, f.SentAt, time.Duration(k-cfg.ClientBurst+1)*interval, "fetch #%d went out early", k)
		}
	}
	// 48 fetches beyond the burst at 50/s: at least 960ms of real time.
	assert.GreaterOrEqual(t, rep.Duration, 960*time.Millisecond)

	var out bytes.Buffer
	Print(&out, cfg, rep)
	assert.Contains(t, out.String(), "50 OK, 0 too many requests")
	assert.Contains(t, out.String(), "fetch")
}

// TestServerReallyLimits is the control: without the limiter the same 50
// fetches at once get 429s, so the zero above is the limiter's doing.
func TestServerReallyLimits(t *testing.T) {
	cfg := Config{Rate: 50, ServerBurst: 10, ClientBurst: 5, Fetches: 50, Unlimited: true}
	rep, err := Run(context.Background(), cfg)
	require.NoError(t, err)
	assert.Greater(t, rep.TooMany, 0)
	assert.Equal(t, 50, rep.OK+rep.TooMany)
}

func TestBadConfig(t *testing.T) {
	_, err := Run(context.Background(), Config{Rate: 5, ServerBurst: 5, ClientBurst: 8, Fetches: 50})
	assert.ErrorContains(t, err, "burst=8")
}
