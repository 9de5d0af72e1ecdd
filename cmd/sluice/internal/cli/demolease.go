package cli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/store"
)

// leaseDemo is `sluice demo -lease`: the server in this process, and
// replicas as processes of this binary (`sluice client -lease -rps 0`),
// each deciding locally as fast as it can under its lease on one limit.
// It prints each replica's decisions a second and ends with the sum
// against rate·T + burst.
type leaseDemo struct {
	replicas    int
	duration    time.Duration
	rate        float64
	burst       int64
	storeSpec   string
	stdout, err io.Writer
}

// Lease timings of the demo's server: short, so that a few seconds show
// the shares settle (a real server keeps the defaults, 20 s and 5 s).
const (
	demoLease   = 2 * time.Second
	demoRefresh = 500 * time.Millisecond
)

var progressRE = regexp.MustCompile(`^(\S+)\s+([\d.]+)s\s+attempts=(\d+) allowed=(\d+)`)
var summaryRE = regexp.MustCompile(`^(\S+) summary: attempts=(\d+) allowed=(\d+)`)

func (d *leaseDemo) run(ctx context.Context) int {
	self, err := os.Executable()
	if err != nil {
		_, _ = fmt.Fprintf(d.err, "sluice demo: %v\n", err)
		return 1
	}
	key := "tenant-a"
	st, err := OpenStore(d.storeSpec, StoreOptions{Sweep: time.Minute})
	if err != nil {
		_, _ = fmt.Fprintf(d.err, "sluice demo: %v\n", err)
		return 1
	}
	defer st.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	p := store.Policy{Name: key, Rate: d.rate, Burst: d.burst}
	cfg := service.Config{Store: st, Default: p, Limits: map[string]store.Policy{key: p}, Fail: store.FailOpen, Logger: quiet,
		// The demo's server is the first ever to hold this policy: no
		// lease can be in force, so it need not learn.
		Leases: &service.LeaseConfig{Lease: demoLease, Refresh: demoRefresh, NoLearning: true}}
	addrc := make(chan net.Addr, 1)
	errc := make(chan error, 1)
	go func() { errc <- RunServer(ctx, cfg, "127.0.0.1:0", quiet, func(a net.Addr) { addrc <- a }) }()
	var addr net.Addr
	select {
	case addr = <-addrc:
	case err := <-errc:
		_, _ = fmt.Fprintf(d.err, "sluice demo: server: %v\n", err)
		return 1
	}
	url := "http://" + addr.String()
	w := d.stdout
	fmt.Fprintf(w, "sluice demo -lease: %d replica processes decide locally under leases on one limit\n\n", d.replicas)
	fmt.Fprintf(w, "  server    %s  (leases of %v, renewed every %v)\n", url, demoLease, demoRefresh)
	fmt.Fprintf(w, "  limit     key %q: %g/s, burst %d, for ALL replicas together\n", key, d.rate, d.burst)
	fmt.Fprintf(w, "  replicas  %d processes, each deciding as fast as it can for %v, no round trip per decision\n\n", d.replicas, d.duration)

	type rep struct {
		id       string
		cmd      *exec.Cmd
		mu       sync.Mutex
		attempts int64 // from the latest progress row
		allowed  int64
		summary  string
		lease    string
		final    [2]int64 // attempts, allowed from the summary
		done     chan struct{}
	}
	reps := make([]*rep, d.replicas)
	header := "  time "
	for i := range reps {
		r := &rep{id: fmt.Sprintf("inst-%d", i+1), done: make(chan struct{})}
		r.cmd = exec.CommandContext(ctx, self, "client", "-lease", "-id", r.id, "-limiter", url, "-key", key,
			"-rps", "0", "-duration", d.duration.String())
		r.cmd.Stderr = d.err
		out, err := r.cmd.StdoutPipe()
		if err != nil {
			_, _ = fmt.Fprintf(d.err, "sluice demo: %v\n", err)
			return 1
		}
		if err := r.cmd.Start(); err != nil {
			_, _ = fmt.Fprintf(d.err, "sluice demo: starting a replica: %v\n", err)
			return 1
		}
		go func() {
			defer close(r.done)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				line := sc.Text()
				r.mu.Lock()
				switch m := summaryRE.FindStringSubmatch(line); {
				case m != nil:
					r.summary = line
					r.final[0], _ = strconv.ParseInt(m[2], 10, 64)
					r.final[1], _ = strconv.ParseInt(m[3], 10, 64)
				case strings.Contains(line, " lease: "):
					r.lease = line
				default:
					if m := progressRE.FindStringSubmatch(line); m != nil {
						r.attempts, _ = strconv.ParseInt(m[3], 10, 64)
						r.allowed, _ = strconv.ParseInt(m[4], 10, 64)
					}
				}
				r.mu.Unlock()
			}
		}()
		reps[i] = r
		header += fmt.Sprintf("  %22s", r.id+" decisions/s (allowed)")
	}
	start := time.Now()
	fmt.Fprintf(w, "%s   allowed so far   the limit allows (%g/s × t + %d)\n", header, d.rate, d.burst)
	prev := make([]int64, len(reps))
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	all := make(chan struct{})
	go func() {
		for _, r := range reps {
			<-r.done
			_ = r.cmd.Wait()
		}
		close(all)
	}()
loop:
	for {
		select {
		case <-tick.C:
			t := time.Since(start)
			line := fmt.Sprintf("  %4.1fs", t.Seconds())
			var sum int64
			for i, r := range reps {
				r.mu.Lock()
				a, al := r.attempts, r.allowed
				r.mu.Unlock()
				line += fmt.Sprintf("  %12s (%7d)", fmtCount(a-prev[i]), al)
				prev[i] = a
				sum += al
			}
			fmt.Fprintf(w, "%s   %14d   %d\n", line, sum, int64(d.rate*t.Seconds())+d.burst)
		case <-all:
			break loop
		case <-ctx.Done():
			<-all
			break loop
		}
	}
	elapsed := time.Since(start)
	fmt.Fprintln(w)
	var total, attempts int64
	for _, r := range reps {
		if r.summary == "" {
			_, _ = fmt.Fprintf(d.err, "sluice demo: replica %s ended without its summary\n", r.id)
			return 1
		}
		fmt.Fprintln(w, r.summary)
		total += r.final[1]
		attempts += r.final[0]
	}
	bound := d.rate*elapsed.Seconds() + float64(d.burst)
	fmt.Fprintf(w, "\n  allowed in total: %d of %d attempts (%s decisions a second, all local)\n", total, attempts,
		fmtCount(int64(float64(attempts)/elapsed.Seconds())))
	verdict := "≤"
	if float64(total) > bound {
		verdict = ">" // would be a bug
	}
	fmt.Fprintf(w, "  the limit:        %g/s × %.2fs + burst %d = %.1f   →  %d %s %.1f\n", d.rate, elapsed.Seconds(), d.burst, bound, total, verdict, bound)
	for _, r := range reps {
		fmt.Fprintln(w, r.lease)
	}
	fmt.Fprintf(w, "\nEach replica decided millions of times a second on its own share; the server saw one renewal\n"+
		"per replica every %v, not one request per decision. The protocol and the bound: docs/leases.md.\n", demoRefresh)
	cancel()
	if err := <-errc; err != nil {
		_, _ = fmt.Fprintf(d.err, "sluice demo: server: %v\n", err)
		return 1
	}
	if float64(total) > bound {
		return 1
	}
	return 0
}

// fmtCount is n with a k or M suffix: 1234567 is "1.23M".
func fmtCount(n int64) string {
	switch {
	case n >= 1e6:
		return fmt.Sprintf("%.2fM", float64(n)/1e6)
	case n >= 1e4:
		return fmt.Sprintf("%.0fk", float64(n)/1e3)
	}
	return strconv.FormatInt(n, 10)
}
