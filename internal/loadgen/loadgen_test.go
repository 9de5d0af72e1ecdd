package loadgen_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/loadgen"
	"github.com/sluice-go/sluice/internal/redistest"
)

func TestMain(m *testing.M) {
	if os.Getenv("SLUICE_LOADGEN_BASELINE") == "1" {
		baselineServer()
		return
	}
	goleak.VerifyTestMain(m)
}

// baselineServer is the baseline the service is measured against: a bare
// net/http server answering every request with a fixed small JSON body, run
// as a child process exactly like `sluice serve`.
func baselineServer() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	fmt.Fprintf(os.Stderr, "msg=listening addr=%s\n", ln.Addr())
	body := []byte(`{"allowed":true,"remaining":9,"limit":10,"rate":10}` + "\n")
	_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}))
}

func TestFixedRate(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(r.URL.Query().Get("key")))
	}))
	defer ts.Close()
	r, err := loadgen.Run(context.Background(), loadgen.Config{
		Addr: strings.TrimPrefix(ts.URL, "http://"), Rate: 500, Duration: 200 * time.Millisecond, Conns: 4,
		Path: func(i int) string { return fmt.Sprintf("/allow?key=k%d", i%10) },
	})
	require.NoError(t, err)
	assert.InDelta(t, 100, r.Sent, 2, "500/s for 0.2 s")
	assert.Equal(t, map[int]int{200: r.Sent}, r.Status)
	assert.Positive(t, r.Quantile(0.5))
}

var listenRE = regexp.MustCompile(`msg=listening addr=(\S+)`)

// TestServiceLoad measures `sluice serve` on loopback: latency at a fixed
// 5k req/s and peak throughput, for each store. It takes about a minute and
// is skipped unless SLUICE_LOADTEST=1.
func TestServiceLoad(t *testing.T) {
	if os.Getenv("SLUICE_LOADTEST") == "" {
		t.Skip("set SLUICE_LOADTEST=1 to run the load measurements")
	}
	bin := filepath.Join(t.TempDir(), "sluice")
	out, err := exec.Command("go", "build", "-o", bin, "../../cmd/sluice").CombinedOutput()
	require.NoError(t, err, "%s", out)
	// The shm tables go on tmpfs, where the service puts them by default: on
	// a disk filesystem page writeback stalls decisions (see shmstore.OnTmpfs).
	shmDir, err := os.MkdirTemp("/dev/shm", "sluice-load-")
	require.NoError(t, err)
	defer os.RemoveAll(shmDir)
	stores := []string{"memory", "shm:" + shmDir}
	if redistest.Binary() != "" {
		stores = append(stores, redistest.Start(t).URL())
	}
	dur := 10 * time.Second
	if d, err := time.ParseDuration(os.Getenv("SLUICE_LOADTEST_DURATION")); err == nil {
		dur = d
	}
	type target struct{ name, store string }
	targets := []target{{"baseline", ""}}
	for _, st := range stores {
		targets = append(targets, target{strings.SplitN(st, ":", 2)[0], st})
	}
	if only := os.Getenv("SLUICE_LOADTEST_ONLY"); only != "" {
		targets = slices.DeleteFunc(targets, func(t target) bool { return !strings.Contains(only, t.name) })
	}
	conns := 16
	if n, err := strconv.Atoi(os.Getenv("SLUICE_LOADTEST_CONNS")); err == nil && n > 0 {
		conns = n
	}
	t.Logf("machine: GOMAXPROCS=%d NumCPU=%d %s/%s %s", runtime.GOMAXPROCS(0), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version())
	for _, tg := range targets {
		cmd := exec.Command(bin, "serve", "-addr", "127.0.0.1:0", "-store", tg.store, "-rate", "1000", "-burst", "1000")
		if tg.store == "" {
			self, err := os.Executable()
			require.NoError(t, err)
			cmd = exec.Command(self)
			cmd.Env = append(os.Environ(), "SLUICE_LOADGEN_BASELINE=1")
		}
		stderr, err := cmd.StderrPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		sc := bufio.NewScanner(stderr)
		addr := ""
		for sc.Scan() {
			if m := listenRE.FindStringSubmatch(sc.Text()); m != nil {
				addr = m[1]
				break
			}
		}
		go func() {
			for sc.Scan() {
			}
		}()
		require.NotEmpty(t, addr)
		path := func(i int) string { return fmt.Sprintf("/allow?key=k%d", i%1000) }
		name := tg.name
		// Warm up connections and the store's tables/scripts.
		_, err = loadgen.Run(context.Background(), loadgen.Config{Addr: addr, Path: path, Rate: 2000, Duration: time.Second})
		require.NoError(t, err)
		r, err := loadgen.Run(context.Background(), loadgen.Config{Addr: addr, Path: path, Rate: 5000, Duration: dur, Conns: conns})
		require.NoError(t, err)
		t.Logf("%-8s at 5k req/s over %d conns: %v", name, conns, r)
		cpu0, cpuOK := processCPU(cmd.Process.Pid)
		peak, err := loadgen.Run(context.Background(), loadgen.Config{Addr: addr, Path: path, Duration: dur, Conns: 32})
		require.NoError(t, err)
		t.Logf("%-8s peak (32 conns, closed loop): %v", name, peak)
		if cpu1, ok := processCPU(cmd.Process.Pid); ok && cpuOK && peak.Sent > peak.Errors {
			// CPU per request is steadier than the peak on a shared machine:
			// time other programs take lowers the peak, not this.
			t.Logf("%-8s peak: server CPU %.1f µs per request", name,
				float64((cpu1-cpu0).Microseconds())/float64(peak.Sent-peak.Errors))
		}
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	}
}

// processCPU is the user + system CPU time process pid has used, from
// /proc (Linux only; false elsewhere). The resolution is the kernel's clock
// tick, 10 ms.
func processCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The fields after the command name (which may hold spaces) in ")".
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14 of proc(5)
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, true // USER_HZ is 100 on Linux
}
