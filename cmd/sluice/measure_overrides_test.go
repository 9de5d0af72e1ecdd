//go:build linux

package main_test

import (
	"context"
	"os"
	"path/filepath"

	"strconv"
	"strings"
	"sync"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sluice-go/sluice/sharedbucket"
)

// TestMeasureOverrides sends distinct Envoy limit overrides (1001/second,
// 1002/second, …) to one `sluice serve -store shm:DIR` and reports the
// process's resident memory and the table directory's tmpfs use before and
// after, the table files left when it exits, and those left once another
// serve has started on the directory. Linux only; it runs with
// SLUICE_MEASURE=1:
//
//	SLUICE_MEASURE=1 go test -run MeasureOverrides -v -count=1 ./cmd/sluice
//
// SLUICE_MEASURE_OVERRIDES (default 10000) sets how many overrides,
// SLUICE_MEASURE_SLOTS the -shm-slots (default: serve's).
func TestMeasureOverrides(t *testing.T) {
	if os.Getenv("SLUICE_MEASURE") == "" {
		t.Skip("set SLUICE_MEASURE=1 (Linux) to measure")
	}
	n, _ := strconv.Atoi(os.Getenv("SLUICE_MEASURE_OVERRIDES"))
	if n <= 0 {
		n = 10000
	}
	dir := shmDir(t)
	// The overrides' domain must be configured: serve gives no bucket to a
	// descriptor outside its rules' domains, override or not.
	rules := filepath.Join(t.TempDir(), "edge.yaml")
	require.NoError(t, os.WriteFile(rules, []byte("domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 1000}\n"), 0o644))
	args := []string{"-store", "shm:" + dir, "-grpc", "127.0.0.1:0", "-config", rules}
	if slots := os.Getenv("SLUICE_MEASURE_SLOTS"); slots != "" {
		args = append(args, "-shm-slots", slots)
	}
	s := serve(t, args...)
	c := rlsClient(t, s)
	pid := s.cmd.Process.Pid
	report := func(when string) {
		files, bytes := tableUse(t, dir)
		t.Logf("%s: serve RSS %s, %d table files holding %.1f MiB of tmpfs", when, rss(t, pid), files, float64(bytes)/(1<<20))
	}
	report("before")
	var wg sync.WaitGroup
	const workers = 8
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				d := &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "198.51.100.7"}},
					Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: uint32(1001 + i), Unit: typev3.RateLimitUnit_SECOND}}
				_, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	report("after " + strconv.Itoa(n) + " distinct overrides")
	if files, _ := tableUse(t, dir); files < 2 {
		t.Errorf("%d table file(s) after %d distinct overrides: the overrides got no tables, nothing was measured", files, n)
	}
	require.Equal(t, 0, s.stop(t))
	files, bytes := tableUse(t, dir)
	t.Logf("after serve exits: %d table files holding %.1f MiB", files, float64(bytes)/(1<<20))
	s = serve(t, args...)
	files, bytes = tableUse(t, dir)
	t.Logf("after another serve starts on the directory: %d table files holding %.1f MiB", files, float64(bytes)/(1<<20))
	require.Equal(t, 0, s.stop(t))
}

// tableUse counts the table files in dir and the bytes they occupy.
func tableUse(t *testing.T, dir string) (files int, bytes int64) {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*"+sharedbucket.TableExt))
	require.NoError(t, err)
	for _, name := range names {
		var st unix.Stat_t
		if unix.Stat(name, &st) == nil {
			files++
			bytes += st.Blocks * 512
		}
	}
	return files, bytes
}

// rss is a process's VmRSS and RssShmem lines from /proc.
func rss(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	require.NoError(t, err)
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") || strings.HasPrefix(line, "RssShmem:") {
			out = append(out, strings.Join(strings.Fields(line), " "))
		}
	}
	return strings.Join(out, ", ")
}
