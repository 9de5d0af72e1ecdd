package bench_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protowire"
)

// fakeDecider takes d per call (on the bubble's clock) and answers by key:
// "deny" denied, "fail" an error, anything else allowed.
type fakeDecider struct{ d time.Duration }

func (f fakeDecider) decide(_ context.Context, key string) (bool, error) {
	time.Sleep(f.d)
	switch key {
	case "deny":
		return false, nil
	case "fail":
		return false, errors.New("fail")
	}
	return true, nil
}

func fakes(n int, d time.Duration) []decider {
	ds := make([]decider, n)
	for i := range ds {
		ds[i] = fakeDecider{d}
	}
	return ds
}

// The closed loop records the calls made in the measured time, none of the
// warm-up's; each worker's next call follows its last.
func TestRunLoadClosedLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := runLoad(fakes(4, time.Millisecond), loadShape{warmup: 100 * time.Millisecond, duration: time.Second, keys: []string{"k"}})
		assert.Equal(t, 4000, r.allowed)
		assert.Zero(t, r.denied+r.bad+r.late+r.unsent)
		assert.InDelta(t, 4000, r.decisionsPerSec(), 0.5)
		assert.Equal(t, time.Millisecond, r.quantile(0.99))
		assert.Equal(t, 4*1100, r.calls, "warm-up included")
	})
}

// An open loop the server keeps up with sends every call on time, and each
// call's latency is its own.
func TestRunLoadOpenLoopKeepsUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := runLoad(fakes(2, time.Millisecond), loadShape{rate: 1000, warmup: 100 * time.Millisecond, duration: time.Second, keys: []string{"k"}})
		assert.Equal(t, 1000, r.allowed)
		assert.Zero(t, r.late+r.unsent)
		assert.Zero(t, r.lateShare())
		assert.Equal(t, time.Millisecond, r.quantile(0.5))
		assert.Equal(t, time.Millisecond, r.quantile(1))
	})
}

// An open loop faster than the server: calls go out late, each charged from
// its intended time, and what was not sent by the end counts as late too;
// every call due in the measured time is either answered or unsent.
func TestRunLoadOpenLoopFallsBehind(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// 2 workers at 5 ms a call: 400 calls/s against 1000 asked.
		r := runLoad(fakes(2, 5*time.Millisecond), loadShape{rate: 1000, warmup: 100 * time.Millisecond, duration: time.Second, keys: []string{"k"}})
		assert.Equal(t, 1000, r.allowed+r.unsent)
		assert.Positive(t, r.unsent)
		assert.Greater(t, r.lateShare(), 0.9)
		assert.Greater(t, r.quantile(0.5), 100*time.Millisecond, "queued calls are charged their wait")
	})
}

// Denials and errors are counted apart, and the first error kept.
func TestRunLoadCountsOutcomes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := runLoad(fakes(3, time.Millisecond), loadShape{duration: 300 * time.Millisecond, keys: []string{"k", "deny", "fail"}})
		assert.Positive(t, r.allowed)
		assert.Positive(t, r.denied)
		assert.Positive(t, r.bad)
		assert.Equal(t, r.allowed+r.denied+r.bad, len(r.lat))
		assert.EqualError(t, r.firstErr, "fail")
	})
}

// The HTTP/1.1 client reads 200 as allowed and 429 as denied, keeps one
// connection for its calls, and reports any other status as an error.
func TestHTTPDecider(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("key") {
		case "deny":
			w.WriteHeader(http.StatusTooManyRequests)
		case "fail":
			http.Error(w, "no", http.StatusInternalServerError)
		default:
			_, _ = w.Write([]byte(`{"allowed":true}`))
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	h := &httpDecider{addr: srv.Listener.Addr().String()}
	defer h.close()
	ctx := context.Background()
	for range 3 {
		ok, err := h.decide(ctx, "k")
		require.NoError(t, err)
		assert.True(t, ok)
	}
	ok, err := h.decide(ctx, "deny")
	require.NoError(t, err)
	assert.False(t, ok)
	assert.Equal(t, int32(1), conns.Load(), "one keep-alive connection")
	_, err = h.decide(ctx, "fail")
	assert.ErrorContains(t, err, "status 500")
}

// gubernatorAllowed reads GetRateLimitsResp as gubernator.proto lays it out.
func TestGubernatorAllowed(t *testing.T) {
	resp := func(fields ...func([]byte) []byte) []byte {
		var one []byte
		for _, f := range fields {
			one = f(one)
		}
		b := protowire.AppendTag(nil, gubReqs, protowire.BytesType)
		return protowire.AppendBytes(b, one)
	}
	status := func(v uint64) func([]byte) []byte {
		return func(b []byte) []byte {
			return protowire.AppendVarint(protowire.AppendTag(b, gubStatus, protowire.VarintType), v)
		}
	}
	remaining := func(b []byte) []byte { // a field the reader skips
		return protowire.AppendVarint(protowire.AppendTag(b, 3, protowire.VarintType), 999)
	}
	errMsg := func(b []byte) []byte {
		return protowire.AppendString(protowire.AppendTag(b, gubError, protowire.BytesType), "bad")
	}

	ok, err := gubernatorAllowed(resp(remaining))
	require.NoError(t, err)
	assert.True(t, ok, "no status field: UNDER_LIMIT")
	ok, err = gubernatorAllowed(resp(status(1), remaining))
	require.NoError(t, err)
	assert.False(t, ok, "OVER_LIMIT")
	_, err = gubernatorAllowed(resp(errMsg))
	assert.ErrorContains(t, err, "bad")
	_, err = gubernatorAllowed(nil)
	assert.Error(t, err)
}
