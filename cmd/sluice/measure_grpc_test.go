package main_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-go/sluice/cmd/sluice/internal/rlsload"
	"github.com/sluice-go/sluice/internal/loadgen"
	"github.com/sluice-go/sluice/internal/redistest"
)

// TestMeasureGRPCvsHTTP measures decisions per second and latency of
// ShouldRateLimit against /allow on one `sluice serve`, same rules, same
// store, same run, closed loop with 16 requests in flight each, and (on
// Linux) the server process's CPU time per decision of each, and the load
// generator's (this process, the other clients idle). /allow is
// driven by loadgen (raw HTTP/1.1, 16 connections), ShouldRateLimit by two
// clients in turn, each with 4 HTTP/2 connections of 4 calls in flight:
// rlsload (raw HTTP/2, as lean as loadgen) and grpc-go's. It runs only
// with SLUICE_MEASURE=1 (it takes a while and wants a quiet machine):
//
//	SLUICE_MEASURE=1 go test -run MeasureGRPCvsHTTP -v -count=1 ./cmd/sluice
//
// SLUICE_MEASURE_STORES (default "memory,shm"; "redis" starts a redis-server,
// whose CPU then counts with the server's), SLUICE_MEASURE_SECS (default 5)
// and SLUICE_MEASURE_ROUNDS (default 2) tune it; SLUICE_MEASURE_CONNS=N
// drives instead N HTTP connections and N HTTP/2 connections of one call
// each, both clients (the shape of the peers harness's peak: N=32).
func TestMeasureGRPCvsHTTP(t *testing.T) {
	if os.Getenv("SLUICE_MEASURE") == "" {
		t.Skip("set SLUICE_MEASURE=1 to measure")
	}
	secs := envInt("SLUICE_MEASURE_SECS", 5)
	rounds := envInt("SLUICE_MEASURE_ROUNDS", 2)
	stores := envOr("SLUICE_MEASURE_STORES", "memory,shm")
	httpConns, grpcConns, perConn := 16, 4, 4
	if n := envInt("SLUICE_MEASURE_CONNS", 0); n > 0 {
		httpConns, grpcConns, perConn = n, n, 1
	}
	file := filepath.Join(t.TempDir(), "ratelimit.yaml")
	// Every key its own bucket of 1000/s: nearly every decision is "allowed",
	// so both APIs do the same work per request.
	writeRules(t, file, "domain: http\ndescriptors:\n  - key: key\n    rate_limit: {unit: second, requests_per_unit: 1000}\n")
	// The lean client's requests, encoded once: the same 1000 keys as
	// the HTTP run's.
	reqs := make([][]byte, 1000)
	for i := range reqs {
		b, err := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "http", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "key", Value: "k" + strconv.Itoa(i)}}}}})
		require.NoError(t, err)
		reqs[i] = b
	}
	for _, st := range strings.Split(stores, ",") {
		var rs *redistest.Server
		switch st {
		case "shm":
			st = "shm:" + shmDir(t)
		case "redis":
			rs = redistest.Start(t)
			st = rs.URL()
		}
		s := serve(t, "-store", st, "-grpc", "127.0.0.1:0", "-config", file)
		addr := strings.TrimPrefix(s.URL, "http://")
		pid := s.cmd.Process.Pid
		m := grpcListenRE.FindStringSubmatch(s.logs.String())
		require.NotNil(t, m)
		grpcAddr := m[1]
		// cpu is the CPU time the server (with its redis-server, if any)
		// and this process (the load generator) have used.
		cpu := func() (server, client time.Duration) {
			server, _ = processCPU(pid)
			if rs != nil {
				r, _ := processCPU(rs.Pid())
				server += r
			}
			client, _ = processCPU(os.Getpid())
			return server, client
		}
		who := "server"
		if rs != nil {
			who = "server+Redis"
		}
		for round := range rounds { // alternate, so drift on a shared machine hits both
			s0, l0 := cpu()
			h, err := loadgen.Run(context.Background(), loadgen.Config{Addr: addr, Conns: httpConns,
				Path:     func(i int) string { return "/allow?key=k" + strconv.Itoa(i%1000) },
				Duration: time.Duration(secs) * time.Second})
			require.NoError(t, err)
			s1, l1 := cpu()
			httpCPU := perDecision(s1-s0, h.Sent-h.Errors)
			t.Logf("%s round %d HTTP /allow: %.0f decisions/s, p50 %s, p99 %s, status %v, %s CPU %s, client CPU %s per decision",
				st, round+1, h.Throughput(), h.Quantile(0.5), h.Quantile(0.99), h.Status, who, httpCPU, perDecision(l1-l0, h.Sent-h.Errors))
			s1, l1 = cpu()
			l, err := rlsload.Run(context.Background(), rlsload.Config{Addr: grpcAddr, Conns: grpcConns, Streams: perConn,
				Requests: reqs, Duration: time.Duration(secs) * time.Second})
			require.NoError(t, err)
			require.Zero(t, l.Failed)
			s2, l2 := cpu()
			leanCPU := perDecision(s2-s1, l.Decisions())
			t.Logf("%s round %d gRPC ShouldRateLimit, lean client: %.0f decisions/s, p50 %s, p99 %s, over_limit %d, %s CPU %s, client CPU %s per decision",
				st, round+1, l.Throughput(), l.Quantile(0.5), l.Quantile(0.99), l.OverLimit, who, leanCPU, perDecision(l2-l1, l.Decisions()))
			g := runRLS(t, s, grpcConns, perConn, time.Duration(secs)*time.Second)
			s3, l3 := cpu()
			grpcCPU := perDecision(s3-s2, len(g.lat))
			t.Logf("%s round %d gRPC ShouldRateLimit, grpc-go client: %.0f decisions/s, p50 %s, p99 %s, over_limit %d, %s CPU %s, client CPU %s per decision",
				st, round+1, g.rate, g.q(0.5), g.q(0.99), g.over, who, grpcCPU, perDecision(l3-l2, len(g.lat)))
			// Why two gRPC clients: the load generator shares the cores
			// with the server, so a peak also measures the client. The
			// lean one (rlsload, raw HTTP/2 frames, as loadgen's raw
			// HTTP/1.1) makes the row that compares the servers;
			// grpc-go's, dearer per call, is what a full gRPC client
			// leaves the server. The server's CPU per decision is the
			// ratio free of either client.
			if httpCPU > 0 && leanCPU > 0 && grpcCPU > 0 {
				t.Logf("%s round %d gRPC ÷ HTTP: decisions/s %.2f lean, %.2f grpc-go; %s CPU per decision %.2f lean, %.2f grpc-go",
					st, round+1, l.Throughput()/h.Throughput(), g.rate/h.Throughput(), who,
					float64(leanCPU)/float64(httpCPU), float64(grpcCPU)/float64(httpCPU))
			}
		}
		require.Equal(t, 0, s.stop(t))
	}
}

// perDecision is cpu spread over n decisions (0 when either is unknown).
func perDecision(cpu time.Duration, n int) time.Duration {
	if cpu <= 0 || n <= 0 {
		return 0
	}
	return cpu / time.Duration(n)
}

type rlsRun struct {
	rate float64
	lat  []time.Duration
	over int
}

func (r *rlsRun) q(q float64) time.Duration {
	i := int(q*float64(len(r.lat))+0.5) - 1
	return r.lat[min(max(i, 0), len(r.lat)-1)]
}

// runRLS calls ShouldRateLimit in a closed loop from conns connections with
// perConn calls in flight on each (Envoy keeps a few long-lived HTTP/2
// connections and multiplexes on them).
func runRLS(t *testing.T, s *server, conns, perConn int, d time.Duration) *rlsRun {
	t.Helper()
	m := grpcListenRE.FindStringSubmatch(s.logs.String())
	require.NotNil(t, m)
	var mu sync.Mutex
	res := &rlsRun{}
	start := time.Now()
	var wg sync.WaitGroup
	for range conns {
		cc, err := grpc.NewClient(m[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		defer cc.Close()
		c := rlsv3.NewRateLimitServiceClient(cc)
		for w := range perConn {
			wg.Go(func() {
				var lat []time.Duration
				over := 0
				req := &rlsv3.RateLimitRequest{Domain: "http", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
					Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "key"}}}}}
				for i := w; time.Since(start) < d; i += perConn * conns {
					req.Descriptors[0].Entries[0].Value = "k" + strconv.Itoa(i%1000)
					t0 := time.Now()
					r, err := c.ShouldRateLimit(context.Background(), req)
					if err != nil {
						t.Error(err)
						return
					}
					lat = append(lat, time.Since(t0))
					if r.OverallCode != rlsv3.RateLimitResponse_OK {
						over++
					}
				}
				mu.Lock()
				res.lat = append(res.lat, lat...)
				res.over += over
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	res.rate = float64(len(res.lat)) / time.Since(start).Seconds()
	slices.Sort(res.lat)
	return res
}

// TestMeasureGRPCAB compares the gRPC path of two sluice binaries: both
// serve at once (same rules as TestMeasureGRPCvsHTTP, store per
// SLUICE_MEASURE_STORES, default memory), and each pass drives one then the
// other (the order alternating) with the lean client, 4 connections of 4
// calls in flight, for SLUICE_MEASURE_SECS (default 3); it logs each pass's
// decisions/s and server CPU per decision, then the medians and B ÷ A. It
// runs only with SLUICE_MEASURE_AB naming the binaries:
//
//	go build -o /tmp/a . && (change) && go build -o /tmp/b . &&
//	SLUICE_MEASURE_AB=/tmp/a,/tmp/b SLUICE_MEASURE_PASSES=7 go test -count=1 -run MeasureGRPCAB -v ./cmd/sluice
//
// SLUICE_MEASURE_PASSES (default 5) sets the passes; SLUICE_MEASURE_CLIENT=grpc-go
// drives with grpc-go's client instead. SLUICE_MEASURE_DESCS=N (default 1)
// sends N descriptors per request, each on its own rule (then "decisions"
// are requests); SLUICE_MEASURE_CONNS and SLUICE_MEASURE_STREAMS (default 4
// each) set the calls in flight. On Redis each pass also logs Redis's CPU
// per request and, with the lean client, the median latency.
func TestMeasureGRPCAB(t *testing.T) {
	bins := strings.Split(os.Getenv("SLUICE_MEASURE_AB"), ",")
	if len(bins) != 2 {
		t.Skip("set SLUICE_MEASURE_AB=binaryA,binaryB to measure")
	}
	secs := envInt("SLUICE_MEASURE_SECS", 3)
	passes := envInt("SLUICE_MEASURE_PASSES", 5)
	stores := envOr("SLUICE_MEASURE_STORES", "memory")
	grpcGo := os.Getenv("SLUICE_MEASURE_CLIENT") == "grpc-go"
	file := filepath.Join(t.TempDir(), "ratelimit.yaml")
	descs := envInt("SLUICE_MEASURE_DESCS", 1)
	conns, streams := envInt("SLUICE_MEASURE_CONNS", 4), envInt("SLUICE_MEASURE_STREAMS", 4)
	yaml := "domain: http\ndescriptors:\n  - key: key\n    rate_limit: {unit: second, requests_per_unit: 1000}\n"
	for j := 1; j < descs; j++ {
		yaml += "  - key: key" + strconv.Itoa(j) + "\n    rate_limit: {unit: second, requests_per_unit: 1000}\n"
	}
	writeRules(t, file, yaml)
	reqs := make([][]byte, 1000)
	for i := range reqs {
		r := &rlsv3.RateLimitRequest{Domain: "http"}
		for j := range descs {
			key := "key"
			if j > 0 {
				key += strconv.Itoa(j)
			}
			r.Descriptors = append(r.Descriptors, &ratelimitv3.RateLimitDescriptor{
				Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: "k" + strconv.Itoa(i)}}})
		}
		b, err := proto.Marshal(r)
		require.NoError(t, err)
		reqs[i] = b
	}
	d := time.Duration(secs) * time.Second
	for _, st := range strings.Split(stores, ",") {
		var srv [2]*server
		var rds [2]*redistest.Server
		for i, bin := range bins {
			st := st
			switch st {
			case "shm":
				st = "shm:" + shmDir(t) // one segment each: the binaries may differ in layout
			case "redis":
				rds[i] = redistest.Start(t)
				st = rds[i].URL()
			}
			srv[i] = serveBinary(t, bin, "-store", st, "-grpc", "127.0.0.1:0", "-config", file)
		}
		var rate, cpu [2][]float64
		for p := range passes {
			for k := range 2 {
				i := k ^ p&1 // A first on even passes, B first on odd ones
				s := srv[i]
				m := grpcListenRE.FindStringSubmatch(s.logs.String())
				require.NotNil(t, m)
				c0, _ := processCPU(s.cmd.Process.Pid)
				var r0 time.Duration
				if rds[i] != nil {
					r0, _ = processCPU(rds[i].Pid())
				}
				var r float64
				var n int
				var p50 time.Duration
				if grpcGo {
					g := runRLS(t, s, conns, streams, d)
					r, n = g.rate, len(g.lat)
				} else {
					l, err := rlsload.Run(context.Background(), rlsload.Config{Addr: m[1], Conns: conns, Streams: streams, Requests: reqs, Duration: d})
					require.NoError(t, err)
					require.Zero(t, l.Failed)
					r, n, p50 = l.Throughput(), l.Decisions(), l.Quantile(0.5)
				}
				c1, _ := processCPU(s.cmd.Process.Pid)
				c := perDecision(c1-c0, n)
				rate[i] = append(rate[i], r)
				cpu[i] = append(cpu[i], float64(c)/1e3)
				extra := ""
				if rds[i] != nil {
					r1, _ := processCPU(rds[i].Pid())
					extra = fmt.Sprintf(", Redis CPU %.1fµs", float64(perDecision(r1-r0, n))/1e3)
				}
				if p50 > 0 {
					extra += fmt.Sprintf(", median latency %v", p50.Round(time.Microsecond))
				}
				t.Logf("%s pass %d %s: %.0f decisions/s, server CPU %.1fµs per decision%s", st, p+1, "AB"[i:i+1], r, float64(c)/1e3, extra)
			}
		}
		logAB(t, st, rate, cpu)
		for _, s := range srv {
			require.Equal(t, 0, s.stop(t))
		}
	}
}

// envInt is the positive integer in the environment variable name, or def
// when it is unset or not one: the measuring tests' knobs.
func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// envOr is the environment variable name, or def when it is unset or empty.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// logAB logs an A/B's medians of decisions/s and server CPU per decision
// (µs) for binaries A and B, one sample per pass in rate and cpu, and
// their B ÷ A. Why the ratios of each pass too: on shared cores the load
// changes from pass to pass, and both sides of a pass see about the same.
func logAB(t *testing.T, store string, rate, cpu [2][]float64) {
	med := func(x []float64) float64 { x = slices.Clone(x); slices.Sort(x); return x[len(x)/2] }
	var rr, cr []float64
	for p := range rate[0] {
		rr = append(rr, rate[1][p]/rate[0][p])
		cr = append(cr, cpu[1][p]/cpu[0][p])
	}
	t.Logf("%s median A: %.0f decisions/s, %.1fµs; B: %.0f decisions/s, %.1fµs; B ÷ A: decisions/s %.3f, server CPU per decision %.3f; median of the passes' B ÷ A: %.3f, %.3f",
		store, med(rate[0]), med(cpu[0]), med(rate[1]), med(cpu[1]), med(rate[1])/med(rate[0]), med(cpu[1])/med(cpu[0]), med(rr), med(cr))
}
