package main_test

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMeasureLeaseServerCPU measures what 8 replicas cost the server per
// decision when they ask it for every decision (`sluice client`, GET
// /allow) against when they decide under leases (`sluice client -lease`,
// one POST /lease per replica per refresh interval): one real `sluice
// serve` (memory store, one policy of 10⁶/s that both ways share), 8
// replica processes at a time, the server process's CPU time (from
// /proc/PID/stat) over each run divided by the decisions the replicas made
// (the attempts of their summary lines, allowed or denied). Two loads, in
// turn, in rounds: 8 × 400 decisions a second (the same work both ways),
// and as fast as each replica goes (/allow: -rps 1e6, one request after
// another; leases: -rps 0). It runs only with SLUICE_MEASURE=1:
//
//	SLUICE_MEASURE=1 go test -run MeasureLeaseServerCPU -v -count=1 ./cmd/sluice
//
// SLUICE_MEASURE_SECS (default 5) is each run's length, SLUICE_MEASURE_ROUNDS
// (default 2) the rounds.
func TestMeasureLeaseServerCPU(t *testing.T) {
	if os.Getenv("SLUICE_MEASURE") == "" {
		t.Skip("set SLUICE_MEASURE=1 to measure")
	}
	secs := envInt("SLUICE_MEASURE_SECS", 5)
	rounds := envInt("SLUICE_MEASURE_ROUNDS", 2)
	const replicas = 8
	// Why a 1 s refresh (default 5 s): five times the renewals of the
	// default, so the lease rows are not flattered by a run shorter than
	// a few intervals.
	s := serve(t, "-limits", "tenant-a=1000000:1000000", "-lease-learn=false", "-lease-refresh", "1s")
	pid := s.cmd.Process.Pid
	type row struct {
		name string
		args []string
	}
	rows := []row{
		{"/allow, 8 × 400/s", []string{"-rps", "400"}},
		{"lease, 8 × 400/s", []string{"-lease", "-rps", "400"}},
		{"/allow, full speed", []string{"-rps", "1000000"}},
		{"lease, full speed", []string{"-lease", "-rps", "0"}},
	}
	for round := range rounds {
		for _, r := range rows {
			cpu0, ok := processCPU(pid)
			require.True(t, ok)
			decisions, clientCPU := runClients(t, s.URL, replicas, time.Duration(secs)*time.Second, r.args)
			cpu1, _ := processCPU(pid)
			server := cpu1 - cpu0
			require.Positive(t, decisions)
			// The server's CPU includes its idle work and the replicas'
			// starts and ends: what the server spends for them, all told.
			t.Logf("round %d %-20s decisions %11d (%9.0f/s)  server CPU %6s: %10.4f s per million decisions  replicas' CPU %7.3f µs per decision",
				round+1, r.name, decisions, float64(decisions)/float64(secs), server.Round(time.Millisecond),
				server.Seconds()/float64(decisions)*1e6, float64(clientCPU.Nanoseconds())/1e3/float64(decisions))
		}
	}
	require.Equal(t, 0, s.stop(t))
}

// runClients runs n `sluice client` processes with args against url for d
// and returns their decisions (attempts) and CPU time together.
func runClients(t *testing.T, url string, n int, d time.Duration, args []string) (int, time.Duration) {
	t.Helper()
	var (
		mu        sync.Mutex
		decisions int
		cpu       time.Duration
		wg        sync.WaitGroup
	)
	for i := range n {
		wg.Go(func() {
			cmd := exec.Command(binary, append([]string{"client", "-id", fmt.Sprintf("inst-%d", i+1), "-limiter", url,
				"-key", "tenant-a", "-duration", d.String()}, args...)...)
			out, err := cmd.CombinedOutput()
			if !assertNoErr(t, err, out) {
				return
			}
			m := -1
			for _, line := range strings.Split(string(out), "\n") {
				if a, ok := strings.CutPrefix(line, fmt.Sprintf("inst-%d summary: attempts=", i+1)); ok {
					m, _ = strconv.Atoi(strings.Fields(a)[0])
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if m < 0 {
				t.Errorf("no summary line:\n%s", out)
				return
			}
			decisions += m
			cpu += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		})
	}
	wg.Wait()
	return decisions, cpu
}

func assertNoErr(t *testing.T, err error, out []byte) bool {
	if err != nil {
		t.Errorf("sluice client: %v\n%s", err, out)
		return false
	}
	return true
}
