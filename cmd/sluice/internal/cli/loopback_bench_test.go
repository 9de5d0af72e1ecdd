package cli

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice/cmd/sluice/redisstore"
	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/store"
)

// BenchmarkLoopback is /allow over real HTTP/1.1 on loopback, 32 keep-alive
// connections driven as hard as they go: ns/op is the inverse of the peak,
// cpu-ns/op the CPU time of the whole process (server and client) per
// request, steadier than ns/op on a shared machine, and allocs/op is the
// server's allocations per request plus the client's (a raw TCP client that
// allocates nothing per request). Rows:
//
//   - floor: a bare net/http server that answers every request with a body
//     of Sluice's size and decides nothing (the load test's floor);
//   - floor-headers: the floor answering with the header fields Sluice
//     sends (constant values, set by direct map assignment), to show how
//     much of the gap to the floor is the fields the API promises: not a
//     baseline to beat, an account of where the time goes;
//   - serve-memory: RunServer, as `sluice serve -store memory` runs;
//   - serve-redis: the same on a redis-server started for the run (skipped
//     without one);
//   - handler-memory: the same handler in a bare http.Server (no timeouts),
//     which separates the handler's cost from the server settings'.
//
// Compare the rows of one run: serve-memory ÷ floor is the service's share of
// the transport's peak.
func BenchmarkLoopback(b *testing.B) {
	floorBody := []byte(`{"allowed":true,"remaining":999,"limit":1000,"rate":1000}` + "\n")
	floor := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(floorBody)
	})
	// The fields and values of an allowed answer at rate 1000, burst 1000.
	fields := http.Header{
		"Content-Type":          {"application/json"},
		"Cache-Control":         {"no-store"},
		"X-Ratelimit-Limit":     {"1000"},
		"X-Ratelimit-Remaining": {"999"},
		"Ratelimit-Policy":      {`"default";q=1000;w=1;sluice-burst=1000`},
		"Ratelimit":             {`"default";r=999;t=1`},
	}
	floorHeaders := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		for k, v := range fields {
			h[k] = v
		}
		_, _ = w.Write(floorBody)
	})
	cfg := func() service.Config {
		return service.Config{Store: store.NewMemory(), Default: store.Policy{Rate: 1000, Burst: 1000},
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	}
	b.Run("floor", func(b *testing.B) { loopback(b, bareServer(b, floor)) })
	b.Run("floor-headers", func(b *testing.B) { loopback(b, bareServer(b, floorHeaders)) })
	b.Run("serve-memory", func(b *testing.B) { loopback(b, runServer(b, cfg())) })
	b.Run("serve-redis", func(b *testing.B) {
		srv := redistest.Start(b)
		st, err := redisstore.Open(srv.URL())
		if err != nil {
			b.Fatal(err)
		}
		c := cfg()
		c.Store.Close()
		c.Store = st
		c.StoreTimeout = 5 * time.Second // a stall is not a failed-closed 503
		loopback(b, runServer(b, c))
	})
	b.Run("handler-memory", func(b *testing.B) {
		c := cfg()
		srv, err := service.New(c)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Store.Close() })
		loopback(b, bareServer(b, srv))
	})
}

// runServer runs RunServer with c on a loopback port until b ends (closing
// c.Store then) and returns its address.
func runServer(b *testing.B, c service.Config) string {
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- RunServer(ctx, c, "127.0.0.1:0", c.Logger, func(a net.Addr) { addr <- a.String() })
	}()
	a := <-addr
	b.Cleanup(func() { cancel(); <-done; c.Store.Close() })
	return a
}

func bareServer(b *testing.B, h http.Handler) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	hs := &http.Server{Handler: h}
	done := make(chan struct{})
	go func() { _ = hs.Serve(ln); close(done) }()
	b.Cleanup(func() { _ = hs.Close(); <-done })
	return ln.Addr().String()
}

// loopback sends GET /allow?key=kN over 32 connections until b.N answers
// came back, each checked to be a 200.
func loopback(b *testing.B, addr string) {
	var next atomic.Int64
	b.SetParallelism(16) // 32 connections on 2 cores, as the load test's peak
	b.ReportAllocs()
	cpu0 := processCPU()
	defer func() { b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op") }()
	b.RunParallel(func(pb *testing.PB) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			b.Error(err)
			return
		}
		defer conn.Close()
		r := bufio.NewReaderSize(conn, 4096)
		base := int(next.Add(1)) * 1000
		reqs := make([][]byte, 64)
		for i := range reqs {
			reqs[i] = fmt.Appendf(nil, "GET /allow?key=k%d HTTP/1.1\r\nHost: sluice\r\n\r\n", base+i)
		}
		body := make([]byte, 512)
		for i := 0; pb.Next(); i++ {
			if _, err := conn.Write(reqs[i&63]); err != nil {
				b.Error(err)
				return
			}
			status, n, err := readResponse(r)
			if err != nil || status != 200 {
				b.Errorf("status %d, err %v", status, err)
				return
			}
			if _, err := io.ReadFull(r, body[:n]); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// readResponse reads a response's status line and headers and returns the
// status and Content-Length.
func readResponse(r *bufio.Reader) (status, length int, err error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return 0, 0, err
	}
	if len(line) < 12 {
		return 0, 0, fmt.Errorf("status line %q", line)
	}
	status, _ = strconv.Atoi(string(line[9:12]))
	for {
		line, err = r.ReadSlice('\n')
		if err != nil {
			return 0, 0, err
		}
		if len(line) <= 2 {
			return status, length, nil
		}
		if v, ok := bytes.CutPrefix(line, []byte("Content-Length: ")); ok {
			length, _ = strconv.Atoi(string(bytes.TrimSpace(v)))
		}
	}
}
