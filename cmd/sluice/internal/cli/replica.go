package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluice-go/sluice/client"
)

// Replica plays one replica of a service: RPS times a second it wants one
// unit of work on Key and asks the rate-limit service first.
type Replica struct {
	ID       string
	Client   *client.Client
	Key      string
	RPS      float64
	Duration time.Duration
	Phase    time.Duration // delay before the first attempt (counted in Duration)
	// Start is the instant AllowedAt counts from (default: when Run starts).
	Start time.Time
}

// ReplicaStats counts a replica's attempts. Latencies are of requests that
// went to the service (cached denials cost none).
type ReplicaStats struct {
	ID                      string
	Attempts                int64
	Allowed, Denied, Errors int64
	Cached                  int64           // denials answered by the local deny cache
	Degraded                int64           // answered by the service's -fail mode, its store down
	WorkDone                int64           // allowed, plus errors under fail-open
	AllowedAt               []time.Duration // when each allowed request was answered, since Replica.Start
	latencies               []time.Duration
}

// Percentile returns the q-quantile (0..1) of service request latencies.
func (s *ReplicaStats) Percentile(q float64) time.Duration {
	if len(s.latencies) == 0 {
		return 0
	}
	l := slices.Clone(s.latencies)
	slices.Sort(l)
	i := int(q*float64(len(l))+0.5) - 1
	return l[min(max(i, 0), len(l)-1)]
}

// Requests is the number of requests that went to the service.
func (s *ReplicaStats) Requests() int { return len(s.latencies) }

// Summary is the replica's one-line account, e.g.
// "inst-1 summary: attempts=159 allowed=31 denied=127 → work done=32",
// with degraded= (answers per the service's -fail) and errors= (the service
// unreachable) added when there were any.
func (s *ReplicaStats) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s summary: attempts=%d allowed=%d denied=%d", s.ID, s.Attempts, s.Allowed, s.Denied)
	if s.Degraded > 0 {
		fmt.Fprintf(&b, " degraded=%d", s.Degraded)
	}
	if s.Errors > 0 {
		fmt.Fprintf(&b, " errors=%d", s.Errors)
	}
	fmt.Fprintf(&b, " → work done=%d", s.WorkDone)
	return b.String()
}

// LatencyLine is e.g. "inst-1 /allow latency: p50=0.6ms p99=11ms (59 requests, 100 denials from the local cache)".
func (s *ReplicaStats) LatencyLine() string {
	return fmt.Sprintf("%s /allow latency: p50=%s p99=%s (%d requests, %d denials from the local cache)",
		s.ID, fmtDur(s.Percentile(0.50)), fmtDur(s.Percentile(0.99)), s.Requests(), s.Cached)
}

func fmtDur(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/1e3)
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.1fms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.0fms", float64(d)/1e6)
	}
}

// Run makes attempts at RPS on average for Duration (or until ctx ends) and
// returns the counts. If live is non-nil it is updated after every attempt,
// for progress shown by another goroutine.
func (r *Replica) Run(ctx context.Context, live *LiveStats) ReplicaStats {
	st := ReplicaStats{ID: r.ID}
	start := r.Start
	if start.IsZero() {
		start = time.Now()
	}
	end := time.Now().Add(r.Duration)
	if r.Phase > 0 {
		t := time.NewTimer(r.Phase)
		select {
		case <-ctx.Done():
			t.Stop()
			return st
		case <-t.C:
		}
	}
	period := float64(time.Second) / r.RPS
	// Why jittered gaps (uniform in [0.5, 1.5]·period, same mean): with a
	// strict ticker every replica asks at a fixed phase, and under GCRA the
	// tokens also arrive at a fixed phase, so the replica whose phase comes
	// first after a token would win every token. Real traffic is irregular.
	next := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for time.Now().Before(end) {
		t0 := time.Now()
		d, err := r.Client.Allow(ctx, r.Key, 1)
		if ctx.Err() != nil {
			break
		}
		st.Attempts++
		if d.Source != client.FromCache {
			st.latencies = append(st.latencies, time.Since(t0))
		}
		switch {
		case err != nil:
			var re *client.RequestError
			if errors.As(err, &re) {
				st.Errors++
				break
			}
			st.Errors++
			if d.Allowed {
				st.WorkDone++
			}
		case d.Degraded != "":
			st.Degraded++
			if d.Allowed {
				st.WorkDone++
			}
		case d.Allowed:
			st.Allowed++
			st.WorkDone++
			st.AllowedAt = append(st.AllowedAt, time.Since(start))
		default:
			st.Denied++
			if d.Source == client.FromCache {
				st.Cached++
			}
		}
		live.set(st)
		next = next.Add(time.Duration(period * (0.5 + rand.Float64())))
		timer.Reset(time.Until(next))
		select {
		case <-ctx.Done():
			return st
		case <-timer.C:
		}
	}
	return st
}

// LiveStats is a replica's latest counts, readable while it runs.
type LiveStats struct {
	mu sync.Mutex
	st ReplicaStats // guarded by mu (latencies not copied)
}

func (l *LiveStats) set(st ReplicaStats) {
	if l == nil {
		return
	}
	l.mu.Lock()
	st.latencies, st.AllowedAt = nil, nil
	l.st = st
	l.mu.Unlock()
}

// Get returns the latest counts.
func (l *LiveStats) Get() ReplicaStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.st
}

// printReplica prints the summary and latency lines.
func printReplica(w io.Writer, st *ReplicaStats) {
	_, _ = fmt.Fprintln(w, st.Summary())
	_, _ = fmt.Fprintln(w, st.LatencyLine())
}
