package main_test

import (
	"bufio"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/redistest"
)

// leaseReplica is a running `sluice client -lease -log-allowed` child.
type leaseReplica struct {
	cmd     *exec.Cmd
	mu      sync.Mutex
	allowed []int64 // UnixNano of each allowed decision, as printed
	summary string
	out     strings.Builder
	done    chan struct{}
}

func startLeaseReplica(t *testing.T, id, url string, d time.Duration) *leaseReplica {
	t.Helper()
	r := &leaseReplica{done: make(chan struct{})}
	r.cmd = exec.Command(binary, "client", "-lease", "-log-allowed", "-id", id, "-limiter", url,
		"-key", "tenant-a", "-rps", "0", "-duration", d.String(), "-fail", "closed")
	out, err := r.cmd.StdoutPipe()
	require.NoError(t, err)
	r.cmd.Stderr = r.cmd.Stdout
	require.NoError(t, r.cmd.Start())
	go func() {
		defer close(r.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			r.mu.Lock()
			if ns, ok := strings.CutPrefix(line, "allowed "); ok {
				v, _ := strconv.ParseInt(ns, 10, 64)
				r.allowed = append(r.allowed, v)
			} else {
				r.out.WriteString(line + "\n")
				if strings.Contains(line, " summary: ") {
					r.summary = line
				}
			}
			r.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		if r.cmd.ProcessState == nil {
			_ = r.cmd.Process.Kill()
			<-r.done
			_ = r.cmd.Wait()
		}
	})
	return r
}

func (r *leaseReplica) wait(t *testing.T) {
	t.Helper()
	<-r.done
	_ = r.cmd.Wait()
}

// maxInWindow is the most allowed decisions in any window of length w
// among the sorted instants ts.
func maxInWindow(ts []int64, w time.Duration) int {
	best, j := 0, 0
	for i := range ts {
		for ts[i]-ts[j] > int64(w) {
			j++
		}
		best = max(best, i-j+1)
	}
	return best
}

// Three replica processes decide locally under leases on one limit (20/s,
// burst 20) over a real `sluice serve`; one replica is killed and the
// server restarted mid-run, on the memory and the Redis store. Over every
// window, all replicas together admit at most burst + rate·window (plus the
// drift margin's slack), and the survivors keep deciding after the restart.
func TestLeaseReplicasKilledAndServerRestarted(t *testing.T) {
	const rate, burst = 20.0, 20
	for _, storeName := range []string{"memory", "redis"} {
		t.Run(storeName, func(t *testing.T) {
			spec := "memory"
			if storeName == "redis" {
				spec = redistest.Start(t).URL()
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			addr := ln.Addr().String()
			require.NoError(t, ln.Close())
			args := []string{"-store", spec, "-limits", fmt.Sprintf("tenant-a=%g:%d", rate, burst),
				"-lease-duration", "2s", "-lease-refresh", "500ms"}
			first := serveBinaryAt(t, addr, append(args, "-lease-learn=false")...)
			url := first.URL
			const run = 8 * time.Second
			reps := []*leaseReplica{
				startLeaseReplica(t, "inst-1", url, run),
				startLeaseReplica(t, "inst-2", url, run),
				startLeaseReplica(t, "inst-3", url, run),
			}
			start := time.Now()
			total := func() int {
				n := 0
				for _, r := range reps {
					r.mu.Lock()
					n += len(r.allowed)
					r.mu.Unlock()
				}
				return n
			}
			// Wait for decisions (a real process: poll), then kill a replica.
			require.Eventually(t, func() bool { return total() >= burst/2 }, 10*time.Second, 10*time.Millisecond)
			require.NoError(t, reps[2].cmd.Process.Signal(syscall.SIGKILL))
			reps[2].wait(t)
			// Restart the server on the same address: it learns for one
			// lease length, granting only what renewals show is held.
			assert.Equal(t, 0, first.stop(t))
			restarted := time.Now()
			second := serveBinaryAt(t, addr, args...)
			n := total()
			reps[0].wait(t)
			reps[1].wait(t)
			end := time.Now()

			var all []int64
			for i, r := range reps {
				all = append(all, r.allowed...)
				if i < 2 {
					assert.Contains(t, r.summary, "summary: attempts=", r.out.String())
				}
			}
			slices.Sort(all)
			t.Logf("%s store: %d allowed in %v (%d after the restart); the limit allows %.0f",
				storeName, len(all), end.Sub(start).Round(time.Millisecond), len(all)-n, burst+rate*end.Sub(start).Seconds())
			// The drift margin (1%) lets a replica's lease end up to 1% of
			// 2 s later than the server thinks: a share of 20/s for 20 ms
			// more, less than one token; allow one.
			for _, w := range []time.Duration{100 * time.Millisecond, time.Second, 3 * time.Second, end.Sub(start)} {
				bound := burst + int(rate*w.Seconds()) + 1
				assert.LessOrEqual(t, maxInWindow(all, w), bound, "window %v", w)
			}
			var after int
			for _, ts := range all {
				if ts > restarted.Add(2*time.Second).UnixNano() {
					after++
				}
			}
			assert.Positive(t, after, "the survivors decide again once the restarted server has learned")
			assert.Equal(t, 0, second.stop(t))
		})
	}
}

// serveBinaryAt starts `sluice serve -addr addr args...`.
func serveBinaryAt(t *testing.T, addr string, args ...string) *server {
	t.Helper()
	s := serve(t, append(args, "-addr", addr)...)
	require.Equal(t, "http://"+addr, s.URL)
	return s
}

var leaseDemoRE = regexp.MustCompile(`allowed in total: (\d+) of (\d+) attempts`)

// The demo with -lease runs three replica processes and holds the sum.
func TestDemoLeaseHoldsTheLimit(t *testing.T) {
	out, err := exec.Command(binary, "demo", "-lease", "-duration", "3s").CombinedOutput()
	require.NoError(t, err, "%s", out)
	m := leaseDemoRE.FindStringSubmatch(string(out))
	require.NotNil(t, m, "%s", out)
	assert.Regexp(t, `→  \d+ ≤ [\d.]+`, string(out))
	for _, id := range []string{"inst-1", "inst-2", "inst-3"} {
		assert.Contains(t, string(out), id+" summary: attempts=")
	}
	attempts, _ := strconv.Atoi(m[2])
	assert.Greater(t, attempts, 10_000, "local decisions, many more than a round trip each could make")
}
