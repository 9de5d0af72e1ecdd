package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/sluice-go/sluice/client"
	"github.com/sluice-go/sluice/store"
)

// Client runs `sluice client`: one replica that asks the service before each
// unit of work, then prints its summary line (see ReplicaStats.Summary)
// and latency percentiles.
func Client(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sluice client", flag.ContinueOnError)
	fs.SetOutput(stderr)
	id := fs.String("id", "inst-1", "replica name printed in the summary")
	limiter := fs.String("limiter", "http://127.0.0.1:8100", "rate-limit service URL")
	key := fs.String("key", "tenant-a", "key whose limit this replica shares")
	rps := fs.Float64("rps", 20, "units of work the replica wants per second")
	duration := fs.Duration("duration", 8*time.Second, "how long to run")
	timeout := fs.Duration("timeout", client.DefaultTimeout, "bound on one /allow request")
	fail := fs.String("fail", "open", "when the service cannot answer: open (do the work) or closed (skip it)")
	noCache := fs.Bool("no-cache", false, "ask the service even while a denial's retry-after runs")
	useLease := fs.Bool("lease", false, "decide locally under a lease on the key's policy, renewed from the service (POST /lease), instead of asking per decision; -rps 0 attempts as fast as it can")
	logAllowed := fs.Bool("log-allowed", false, "with -lease: print \"allowed UNIXNANO\" for each allowed decision as it is made")
	policy := fs.String("policy", "", "with -lease: the policy to lease (default: the key, as -limits names policies)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	mode, err := store.ParseFailMode(*fail)
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "sluice client: -fail: %v\n", err)
		return 2
	}
	if *useLease {
		if *rps < 0 || *duration <= 0 {
			_, _ = fmt.Fprintf(stderr, "sluice client: -rps %v must not be negative and -duration %v must be positive\n", *rps, *duration)
			return 2
		}
		if *policy == "" {
			*policy = *key
		}
		r := &LeaseReplica{ID: *id, URL: *limiter, Policy: *policy, Key: *key, RPS: *rps, Duration: *duration, Fail: mode}
		if *logAllowed {
			r.LogAllowed = stdout
		}
		return runWithProgress(ctx, stdout, stderr, *id, func(live *LiveStats) (ReplicaStats, error) { return r.Run(ctx, live) },
			func(st *ReplicaStats) {
				_, _ = fmt.Fprintln(stdout, st.Summary())
				_, _ = fmt.Fprintln(stdout, r.LeaseLine())
			})
	}
	if *rps <= 0 || *duration <= 0 {
		_, _ = fmt.Fprintf(stderr, "sluice client: -rps %v and -duration %v must be positive\n", *rps, *duration)
		return 2
	}
	opts := []client.Option{client.WithTimeout(*timeout), client.WithFailMode(mode)}
	if *noCache {
		opts = append(opts, client.WithoutDenyCache())
	}
	c, err := client.New(*limiter, opts...)
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "sluice client: -limiter: %v\n", err)
		return 2
	}
	defer c.Close()
	r := Replica{ID: *id, Client: c, Key: *key, RPS: *rps, Duration: *duration}
	return runWithProgress(ctx, stdout, stderr, *id, func(live *LiveStats) (ReplicaStats, error) { return r.Run(ctx, live), nil },
		func(st *ReplicaStats) { printReplica(stdout, st) })
}

// runWithProgress runs a replica, printing one progress row a second (as
// demo prints, so a long run shows life), then its summary by done.
func runWithProgress(ctx context.Context, stdout, stderr io.Writer, id string, run func(*LiveStats) (ReplicaStats, error), done func(*ReplicaStats)) int {
	var live LiveStats
	type result struct {
		st  ReplicaStats
		err error
	}
	res := make(chan result, 1)
	go func() { st, err := run(&live); res <- result{st, err} }()
	start := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			st := live.Get()
			_, _ = fmt.Fprintf(stdout, "%s %5.1fs  attempts=%d allowed=%d denied=%d degraded=%d errors=%d\n",
				id, time.Since(start).Seconds(), st.Attempts, st.Allowed, st.Denied, st.Degraded, st.Errors)
		case r := <-res:
			if r.err != nil {
				_, _ = fmt.Fprintf(stderr, "sluice client: %v\n", r.err)
				return 1
			}
			done(&r.st)
			return 0
		}
	}
}
