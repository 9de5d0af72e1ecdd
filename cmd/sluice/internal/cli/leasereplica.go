package cli

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/sluice-go/sluice/lease"
	"github.com/sluice-go/sluice/ratelimiter"
	"github.com/sluice-go/sluice/store"
)

// LeaseReplica plays one replica that decides locally under a lease on
// Key's policy, renewed from the service at URL: no round trip per
// decision. RPS attempts a second on average, or as many as it can when
// RPS is 0.
type LeaseReplica struct {
	ID       string
	URL      string
	Policy   string
	Key      string
	RPS      float64
	Duration time.Duration
	Fail     store.FailMode // the zero FailMode is lease's default, closed
	Start    time.Time      // when AllowedAt counts from (default: when Run starts)
	// LogAllowed, if not nil, gets a line "allowed UNIXNANO" for each
	// allowed decision, as it is made (tests check the bound over every
	// window across processes from these).
	LogAllowed io.Writer

	// Lease is what the replica's lease client did, once Run returns.
	Lease struct {
		Renewals, Failures int64
		Rate               float64 // the last share, tokens a second
		Burst              int64
	}
}

// Run makes the attempts for Duration (or until ctx ends) and returns the
// counts, updating live (if not nil) as it goes. An error means the lease
// could not start (a refused policy, say).
func (r *LeaseReplica) Run(ctx context.Context, live *LiveStats) (ReplicaStats, error) {
	st := ReplicaStats{ID: r.ID}
	hc := &http.Client{Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	c, err := lease.NewClient(ctx, lease.HTTP(r.URL, hc), lease.Options{Holder: fmt.Sprintf("%s-%x", r.ID, rand.Uint64()), Fail: r.Fail})
	if err != nil {
		return st, err
	}
	b, err := c.Bucket(ctx, r.Policy, r.Key)
	if err != nil {
		return st, err
	}
	if r.RPS > 0 {
		b.Want(r.RPS)
	}
	// The first renewal brings the first share; until it, nothing passes.
	if err := c.Refresh(ctx); err != nil {
		return st, fmt.Errorf("lease: %w", err)
	}
	if err := b.Err(); err != nil {
		return st, fmt.Errorf("lease on policy %q key %q: %w", r.Policy, r.Key, err)
	}
	if r.RPS == 0 {
		// As fast as it can: it would use the whole policy. Say so now
		// rather than let the first interval measure a demand of nothing.
		rate, _ := b.Limit()
		b.Want(rate)
		if err := c.Refresh(ctx); err != nil {
			return st, fmt.Errorf("lease: %w", err)
		}
	}
	rctx, stopRenewing := context.WithCancel(ctx)
	renewed := make(chan struct{})
	go func() { defer close(renewed); _ = c.Run(rctx) }()
	defer func() {
		stopRenewing()
		<-renewed
		// Give the share back, so it reaches the others now, not at expiry.
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = c.Close(cctx)
		cancel()
		s := c.Stats()
		r.Lease.Renewals, r.Lease.Failures = s.Renewals, s.Failures
	}()
	rate, burst := b.Limit()
	lim, err := ratelimiter.New(ctx, rate, int(burst), ratelimiter.Shared(b))
	if err != nil {
		return st, err
	}
	defer lim.Stop()

	start := r.Start
	if start.IsZero() {
		start = time.Now()
	}
	end := time.Now().Add(r.Duration)
	var period float64
	if r.RPS > 0 {
		period = float64(time.Second) / r.RPS
	}
	next := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for n := 0; ; n++ {
		// Why the clock every 64 attempts at full speed: a clock read per
		// decision would be a good part of what a local decision costs.
		if (period > 0 || n&63 == 0) && !time.Now().Before(end) {
			break
		}
		st.Attempts++
		if lim.TryAcquire(1) {
			if r.LogAllowed != nil {
				_, _ = fmt.Fprintf(r.LogAllowed, "allowed %d\n", time.Now().UnixNano())
			}
			st.Allowed++
			st.WorkDone++
			st.AllowedAt = append(st.AllowedAt, time.Since(start))
		} else {
			st.Denied++
		}
		if period == 0 {
			if n&1023 == 0 {
				live.set(st)
				if ctx.Err() != nil {
					break
				}
			}
			continue
		}
		live.set(st)
		next = next.Add(time.Duration(period * (0.5 + rand.Float64()))) // see Replica.Run
		timer.Reset(time.Until(next))
		select {
		case <-ctx.Done():
			return st, nil
		case <-timer.C:
		}
	}
	live.set(st)
	r.Lease.Rate, r.Lease.Burst, _ = b.Share()
	return st, nil
}

// LeaseLine is e.g. "inst-1 lease: share 3.3/s burst 3, 2 renewals (0 failed)".
func (r *LeaseReplica) LeaseLine() string {
	return fmt.Sprintf("%s lease: last share %.4g/s burst %d, %d renewals (%d failed)",
		r.ID, r.Lease.Rate, r.Lease.Burst, r.Lease.Renewals, r.Lease.Failures)
}
