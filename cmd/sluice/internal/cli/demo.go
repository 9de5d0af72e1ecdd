package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/sluice-go/sluice/client"
	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/store"
)

// Demo runs `sluice demo`: a server in this process and three replicas, each
// wanting 20/s of a key limited to 10/s (burst 10), for a few seconds; live
// progress each second, then per-replica summaries and the sum against
// rate·T + burst.
func Demo(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sluice demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	duration := fs.Duration("duration", 4*time.Second, "how long the replicas run")
	replicas := fs.Int("replicas", 3, "number of replicas")
	rps := fs.Float64("rps", 20, "what each replica wants per second")
	rate := fs.Float64("rate", 10, "the shared limit, per second")
	burst := fs.Int64("burst", 10, "the shared burst")
	storeSpec := fs.String("store", "memory", "store for the demo server: memory, shm, shm:DIR, redis://HOST:PORT/DB")
	useLease := fs.Bool("lease", false, "replicas as processes deciding locally under leases (POST /lease), as fast as they can, instead of asking per request")
	plotFile := fs.String("plot", "", "also draw each replica's allowed requests over time against the limit to this file (.svg, .png or .pdf)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *plotFile != "" {
		// Why here: the format is known from the name alone, and a demo
		// that ran for its whole duration must not end in a refusal.
		if err := checkPlotFile(*plotFile); err != nil {
			_, _ = fmt.Fprintf(stderr, "sluice demo: -plot: %v\n", err)
			return 2
		}
	}
	if *replicas < 1 || *rps <= 0 || *duration <= 0 {
		_, _ = fmt.Fprintln(stderr, "sluice demo: -replicas, -rps and -duration must be positive")
		return 2
	}
	key := "tenant-a"
	p := store.Policy{Name: key, Rate: *rate, Burst: *burst}
	if err := p.Validate(); err != nil {
		_, _ = fmt.Fprintf(stderr, "sluice demo: -rate/-burst: %v\n", err)
		return 2
	}
	if *useLease {
		if *plotFile != "" {
			_, _ = fmt.Fprintln(stderr, "sluice demo: -plot is for the demo without -lease")
			return 2
		}
		return (&leaseDemo{replicas: *replicas, duration: *duration, rate: *rate, burst: *burst,
			storeSpec: *storeSpec, stdout: stdout, err: stderr}).run(ctx)
	}
	st, err := OpenStore(*storeSpec, StoreOptions{Sweep: time.Minute})
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "sluice demo: %v\n", err)
		return 1
	}
	defer st.Close()
	if st.Name() != "memory" {
		// shm and Redis keep state across runs: start from a fresh key.
		key = fmt.Sprintf("tenant-a-%d", time.Now().UnixNano())
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	addrc := make(chan net.Addr, 1)
	errc := make(chan error, 1)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := service.Config{Store: st, Default: store.Policy{Rate: *rate, Burst: *burst},
		Limits: map[string]store.Policy{key: p}, Fail: store.FailOpen, Logger: quiet}
	go func() { errc <- RunServer(ctx, cfg, "127.0.0.1:0", quiet, func(a net.Addr) { addrc <- a }) }()
	var addr net.Addr
	select {
	case addr = <-addrc:
	case err := <-errc:
		_, _ = fmt.Fprintf(stderr, "sluice demo: server: %v\n", err)
		return 1
	}
	url := "http://" + addr.String()

	w := stdout
	fmt.Fprintf(w, "sluice demo: %d replicas share one limit through the service\n\n", *replicas)
	fmt.Fprintf(w, "  server    %s  (store: %s)\n", url, st.Name())
	fmt.Fprintf(w, "  limit     key %q: %g/s, burst %d, for ALL replicas together\n", key, *rate, *burst)
	fmt.Fprintf(w, "  replicas  %d, each WANTS %g/s for %v (%g/s in total)\n\n", *replicas, *rps, *duration, *rps*float64(*replicas))

	reps := make([]*Replica, *replicas)
	lives := make([]*LiveStats, *replicas)
	header := "  time "
	for i := range reps {
		c, err := client.New(url)
		if err != nil {
			_, _ = fmt.Fprintf(stderr, "sluice demo: %v\n", err)
			return 1
		}
		defer c.Close()
		reps[i] = &Replica{ID: fmt.Sprintf("inst-%d", i+1), Client: c, Key: key, RPS: *rps, Duration: *duration}
		lives[i] = &LiveStats{}
		header += fmt.Sprintf("  %s", reps[i].ID)
	}
	fmt.Fprintf(w, "%s   allowed so far   the limit allows (%g/s × t + %d)\n", header, *rate, *burst)

	start := time.Now()
	results := make([]ReplicaStats, *replicas)
	var wg sync.WaitGroup
	for i, r := range reps {
		r.Start = start
		// Real replicas are not in step: stagger their tick phases so the
		// first replica does not always ask first after a token arrives.
		r.Phase = time.Duration(float64(time.Second) / *rps * float64(i) / float64(len(reps)))
		wg.Go(func() { results[i] = r.Run(ctx, lives[i]) })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()

	var last time.Duration
	row := func(t time.Duration) {
		last = t
		line := fmt.Sprintf("  %4.1fs", t.Seconds())
		var sum int64
		for _, l := range lives {
			a := l.Get().Allowed
			sum += a
			line += fmt.Sprintf("  %6d", a)
		}
		fmt.Fprintf(w, "%s   %14d   %d\n", line, sum, int64(*rate*t.Seconds())+*burst)
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
loop:
	for {
		select {
		case <-tick.C:
			row(time.Since(start))
		case <-done:
			break loop
		case <-ctx.Done():
			<-done
			break loop
		}
	}
	elapsed := time.Since(start)
	if elapsed-last > 100*time.Millisecond {
		row(elapsed)
	}
	fmt.Fprintln(w)

	var total, attempts int64
	for i := range results {
		fmt.Fprintln(w, results[i].Summary())
		total += results[i].Allowed
		attempts += results[i].Attempts
	}
	bound := *rate*elapsed.Seconds() + float64(*burst)
	fmt.Fprintf(w, "\n  allowed in total: %d of %d attempts\n", total, attempts)
	verdict := "≤"
	if float64(total) > bound {
		verdict = ">" // would be a bug
	}
	fmt.Fprintf(w, "  the limit:        %g/s × %.2fs + burst %d = %.1f   →  %d %s %.1f\n", *rate, elapsed.Seconds(), *burst, bound, total, verdict, bound)
	for i := range results {
		fmt.Fprintln(w, results[i].LatencyLine())
	}
	if *plotFile != "" {
		if err := plotDemo(*plotFile, results, start, elapsed, *rate, *burst); err != nil {
			_, _ = fmt.Fprintf(stderr, "sluice demo: -plot: %v\n", err)
			return 1
		}
		fmt.Fprintf(w, "\n  plot written to %s\n", *plotFile)
	}
	fmt.Fprintf(w, "\nEach replica got about a third, with no coordination between them: the SUM is held at the\n"+
		"limit, not each replica. Run it for real with `sluice serve` and `sluice client`: docs/service.md.\n")
	cancel()
	if err := <-errc; err != nil {
		_, _ = fmt.Fprintf(stderr, "sluice demo: server: %v\n", err)
		return 1
	}
	if float64(total) > bound {
		return 1
	}
	return 0
}
