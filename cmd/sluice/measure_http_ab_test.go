package main_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/loadgen"
	"github.com/sluice-go/sluice/internal/redistest"
)

// TestMeasureHTTPAB compares the HTTP /allow path of two sluice binaries:
// both serve at once (-rate 1000 -burst 1000, store per
// SLUICE_MEASURE_STORES, default redis, each binary its own redis-server),
// and each pass drives one then the other (the order alternating) with
// loadgen, closed loop on 32 connections (the service peers' load), for
// SLUICE_MEASURE_SECS (default 3); it logs each pass's decisions/s and
// server CPU per decision, then the medians and B ÷ A. It runs only with
// SLUICE_MEASURE_AB naming the binaries:
//
//	go build -o /tmp/a . && (change) && go build -o /tmp/b . &&
//	SLUICE_MEASURE_AB=/tmp/a,/tmp/b SLUICE_MEASURE_PASSES=7 go test -count=1 -run MeasureHTTPAB -v ./cmd/sluice
//
// SLUICE_MEASURE_PASSES (default 5) sets the passes.
func TestMeasureHTTPAB(t *testing.T) {
	bins := strings.Split(os.Getenv("SLUICE_MEASURE_AB"), ",")
	if len(bins) != 2 {
		t.Skip("set SLUICE_MEASURE_AB=binaryA,binaryB to measure")
	}
	secs := envInt("SLUICE_MEASURE_SECS", 3)
	passes := envInt("SLUICE_MEASURE_PASSES", 5)
	stores := envOr("SLUICE_MEASURE_STORES", "redis")
	d := time.Duration(secs) * time.Second
	for _, st := range strings.Split(stores, ",") {
		var srv [2]*server
		var scripts [2]func() int64 // script calls Redis has run, for redis
		for i, bin := range bins {
			st := st
			switch st {
			case "shm":
				st = "shm:" + shmDir(t)
			case "redis":
				st = redistest.Start(t).URL()
				opt, err := redis.ParseURL(st)
				require.NoError(t, err)
				rc := redis.NewClient(opt)
				t.Cleanup(func() { _ = rc.Close() })
				scripts[i] = func() int64 { return scriptCalls(t, rc) }
			}
			srv[i] = serveBinary(t, bin, "-store", st, "-rate", "1000", "-burst", "1000")
		}
		var rate, cpu [2][]float64
		for p := range passes {
			for k := range 2 {
				i := k ^ p&1 // A first on even passes, B first on odd ones
				s := srv[i]
				c0, _ := processCPU(s.cmd.Process.Pid)
				var k0 int64
				if scripts[i] != nil {
					k0 = scripts[i]()
				}
				h, err := loadgen.Run(context.Background(), loadgen.Config{Addr: strings.TrimPrefix(s.URL, "http://"), Conns: 32,
					Path:     func(i int) string { return "/allow?key=k" + strconv.Itoa(i%1000) },
					Duration: d})
				require.NoError(t, err)
				c1, _ := processCPU(s.cmd.Process.Pid)
				n := h.Sent - h.Errors
				c := perDecision(c1-c0, n)
				rate[i] = append(rate[i], h.Throughput())
				cpu[i] = append(cpu[i], float64(c)/1e3)
				perCall := ""
				if scripts[i] != nil {
					perCall = ", " + strconv.FormatFloat(float64(n)/float64(scripts[i]()-k0), 'f', 1, 64) + " decisions per script call"
				}
				t.Logf("%s pass %d %s: %.0f decisions/s, status %v, server CPU %.1fµs per decision%s",
					st, p+1, "AB"[i:i+1], h.Throughput(), h.Status, float64(c)/1e3, perCall)
			}
		}
		logAB(t, st, rate, cpu)
		for _, s := range srv {
			require.Equal(t, 0, s.stop(t))
		}
	}
}

// scriptCalls is the EVAL and EVALSHA calls the Redis behind rc has run,
// from INFO commandstats.
func scriptCalls(t *testing.T, rc *redis.Client) int64 {
	info, err := rc.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	var n int64
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_eval:") && !strings.HasPrefix(line, "cmdstat_evalsha:") {
			continue
		}
		_, v, _ := strings.Cut(line, "calls=")
		v, _, _ = strings.Cut(v, ",")
		c, _ := strconv.ParseInt(v, 10, 64)
		n += c
	}
	return n
}
