package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/redisstore"
	"github.com/sluice-go/sluice/internal/gcratest"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/store"
)

// TestGCRACases runs the shared GCRA table against gcra.lua on a real
// redis-server, through Store.Allow.
//
// The script reads Redis's own clock (TIME), which a test cannot set. What
// it can set is the stored TAT: the script uses only TAT − now, so moving
// the stored TAT back by Δ is moving the script's now forward by Δ. Between
// steps the test does that (GET, subtract, SET KEEPTTL), so the script sees
// each step at the case's time plus e, the real time elapsed since the
// case's first request (0 ≤ e ≤ E, E measured, growing from step to step).
//
// What that can check: such a lateness only refills, so every step the
// definition allows is allowed, and a step it denies stays denied while its
// excess (how far past the boundary it is) is above E; each figure then lies
// within E of the definition's, on the side lateness moves it. A case is
// checked up to its first denial within E of the boundary (with 1ns
// boundaries, that is right after the first request); the rest is not.
//
// What it cannot check: the script's answers exactly at a boundary (e is
// never known to be 0, so an allowed step at the boundary does not tell ≤
// from <), and the cost above the burst, which Store.Allow refuses before
// Redis sees it (store.Check). Those are checked exactly on the Go stores.
func TestGCRACases(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, srv.URL())
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer raw.Close()
	ctx := context.Background()

	for n, c := range gcratest.Cases {
		t.Run(c.Name, func(t *testing.T) {
			p := store.Policy{Name: "case", Rate: float64(c.Limit) / c.Window.Seconds(), Burst: c.Burst}
			require.NoError(t, p.Validate())
			// Store.Allow passes the script store.Policy.Interval.
			require.Equal(t, c.Interval, p.Interval(), "the store's T for %d per %v", c.Limit, c.Window)
			key := fmt.Sprintf("gcra-case-%d", n)
			want := gcratest.Replay(c)
			var start time.Time
			for i, st := range c.Steps {
				if i > 0 {
					shiftTAT(t, raw, redisstore.Key(key), st.At-c.Steps[i-1].At)
				} else {
					start = time.Now()
				}
				r, err := s.Allow(ctx, key, st.Cost, p)
				late := time.Since(start) // E: at least how late the script saw this step
				if st.Never {
					require.ErrorIs(t, err, store.ErrCostExceedsBurst, "step %d", i)
					continue
				}
				require.NoError(t, err, "step %d", i)
				if !want[i].Allowed && want[i].Excess <= late {
					t.Logf("steps %d on not checked: step %d is denied by %v, within the %v the script may run late", i, i, want[i].Excess, late)
					return
				}
				T := float64(c.Interval)
				assert.Equal(t, st.Allowed, r.Allowed, "step %d allowed", i)
				assert.GreaterOrEqual(t, r.Remaining, st.Remaining-1e-12, "step %d remaining", i)
				assert.LessOrEqual(t, r.Remaining, st.Remaining+float64(late)/T+1e-12, "step %d remaining", i)
				assert.GreaterOrEqual(t, r.ResetAfter, st.ResetAfter-late, "step %d reset-after", i)
				assert.LessOrEqual(t, r.ResetAfter, st.ResetAfter, "step %d reset-after", i)
				assert.GreaterOrEqual(t, r.RetryAfter, max(st.RetryAfter-late, 0), "step %d retry-after", i)
				assert.LessOrEqual(t, r.RetryAfter, st.RetryAfter, "step %d retry-after", i)
			}
		})
	}
}

// shiftTAT moves the TAT stored at key ("SECONDS NANOS", see gcra.lua) back
// by d, which the script reads as its clock moving forward by d. A missing
// key is a full bucket, which stays full.
func shiftTAT(t *testing.T, raw *redis.Client, key string, d time.Duration) {
	ctx := context.Background()
	v, err := raw.Get(ctx, key).Result()
	if err == redis.Nil || d == 0 {
		return
	}
	require.NoError(t, err)
	sec, nsec, ok := strings.Cut(v, " ")
	require.True(t, ok, "stored TAT %q", v)
	si, err := strconv.ParseInt(sec, 10, 64)
	require.NoError(t, err)
	ni, err := strconv.ParseInt(nsec, 10, 64)
	require.NoError(t, err)
	tat := si*1e9 + ni - int64(d)
	require.NoError(t, raw.SetArgs(ctx, key, fmt.Sprintf("%d %d", tat/1e9, tat%1e9), redis.SetArgs{KeepTTL: true}).Err())
}
