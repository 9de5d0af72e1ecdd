//go:build linux

package main_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// TestMeasureGRPCBounds attacks the gRPC port of one `sluice serve -store
// memory -grpc` as issue reports did, and reports the process's resident
// memory and goroutines (go_goroutines on /metrics):
//
//   - 51,000 streams that send HEADERS and never a message, over 3
//     connections: how many the port refused, and what the rest held until
//     the receive deadline (10 s) ended them;
//   - 16 concurrent requests of 4 MB;
//   - 16 callers sending requests of the largest size (64 KiB, 8,000
//     entries each: the most objects a request can decode to) for 5 s,
//     and meanwhile the latency of one other caller's small requests, one
//     at a time.
//
// Linux only; it runs with SLUICE_MEASURE=1:
//
//	SLUICE_MEASURE=1 go test -run MeasureGRPCBounds -v -count=1 ./cmd/sluice
func TestMeasureGRPCBounds(t *testing.T) {
	if os.Getenv("SLUICE_MEASURE") == "" {
		t.Skip("set SLUICE_MEASURE=1 (Linux) to measure")
	}
	s := serve(t, "-store", "memory", "-grpc", "127.0.0.1:0")
	m := grpcListenRE.FindStringSubmatch(s.logs.String())
	require.NotNil(t, m)
	addr := m[1]
	pid := s.cmd.Process.Pid
	report := func(when string) {
		t.Logf("%s: serve %s, %s goroutines", when, rss(t, pid), metric(t, s.URL, "go_goroutines"))
	}
	report("start")

	// Half-open streams.
	var refused, ended atomic.Int64
	var wg, readers sync.WaitGroup
	defer readers.Wait()
	const conns, perConn = 3, 17000
	start := time.Now()
	for range conns {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer c.Close()
		fr := http2.NewFramer(c, c)
		fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		var wmu sync.Mutex // the reader acks SETTINGS while the writer opens streams
		_, err = io.WriteString(c, http2.ClientPreface)
		require.NoError(t, err)
		require.NoError(t, fr.WriteSettings())
		readers.Go(func() { // reads until the connection closes
			for {
				f, err := fr.ReadFrame()
				if err != nil {
					return
				}
				switch f := f.(type) {
				case *http2.SettingsFrame:
					if !f.IsAck() {
						wmu.Lock()
						_ = fr.WriteSettingsAck()
						wmu.Unlock()
					}
				case *http2.RSTStreamFrame:
					if f.ErrCode == http2.ErrCodeRefusedStream {
						refused.Add(1)
					}
				case *http2.MetaHeadersFrame:
					if f.StreamEnded() {
						ended.Add(1)
					}
				}
			}
		})
		var hbuf bytes.Buffer
		enc := hpack.NewEncoder(&hbuf)
		for i := range perConn {
			hbuf.Reset()
			for _, f := range []hpack.HeaderField{
				{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
				{Name: ":path", Value: "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"},
				{Name: ":authority", Value: "sluice"}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
			} {
				require.NoError(t, enc.WriteField(f))
			}
			wmu.Lock()
			err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: hbuf.Bytes(), EndHeaders: true})
			wmu.Unlock()
			require.NoError(t, err)
		}
	}
	t.Logf("sent %d half-open streams on %d connections in %v", conns*perConn, conns, time.Since(start).Round(time.Millisecond))
	report("half-open streams sent")
	require.Eventually(t, func() bool { return refused.Load()+ended.Load() == conns*perConn }, time.Minute, 100*time.Millisecond)
	t.Logf("refused (REFUSED_STREAM) %d, ended by the server with trailers %d, after %v", refused.Load(), ended.Load(), time.Since(start).Round(time.Millisecond))
	report("every half-open stream ended")

	// Requests too large.
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(8<<20)))
	require.NoError(t, err)
	defer cc.Close()
	client := rlsv3.NewRateLimitServiceClient(cc)
	big := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: strings.Repeat("v", 4<<20)}}}}}
	start = time.Now()
	var exhausted atomic.Int64
	for range 16 {
		wg.Go(func() {
			_, err := client.ShouldRateLimit(context.Background(), big)
			if status.Code(err) == codes.ResourceExhausted {
				exhausted.Add(1)
			}
		})
	}
	wg.Wait()
	t.Logf("16 requests of 4 MB took %v", time.Since(start).Round(time.Millisecond))
	t.Logf("16 requests of %d bytes: %d RESOURCE_EXHAUSTED", proto.Size(big), exhausted.Load())
	report("after 16 requests of 4 MB")

	// Requests of the largest size, 16 at a time, and one small caller.
	largest := manyEntries(64 << 10)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var calls, errs atomic.Int64
	var peak atomic.Int64
	for range 16 {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		defer c.Close()
		cl := rlsv3.NewRateLimitServiceClient(c)
		{
			wg.Go(func() {
				for ctx.Err() == nil {
					_, err := cl.ShouldRateLimit(ctx, largest)
					if ctx.Err() != nil {
						return
					}
					calls.Add(1)
					if err != nil && errs.Add(1) == 1 {
						t.Logf("first error: %v", err)
					}
				}
			})
		}
	}
	wg.Go(func() { // the resident memory's peak, every 50 ms
		for ctx.Err() == nil {
			peak.Store(max(peak.Load(), vmRSS(t, pid)))
			time.Sleep(50 * time.Millisecond)
		}
	})
	small := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
	var lat []time.Duration
	for ctx.Err() == nil {
		t0 := time.Now()
		if _, err := client.ShouldRateLimit(ctx, small); err == nil {
			lat = append(lat, time.Since(t0))
		}
	}
	wg.Wait()
	slices.Sort(lat)
	q := func(f float64) time.Duration { return lat[int(f*float64(len(lat)-1))].Round(10 * time.Microsecond) }
	t.Logf("16 callers of %d-byte requests for 5 s: %d answered (%d errors); peak RSS %d MiB; the small caller: %d calls, p50 %v, p99 %v, max %v",
		proto.Size(largest), calls.Load(), errs.Load(), peak.Load()>>10, len(lat), q(0.5), q(0.99), q(1))
	report("after the largest requests")
}

// manyEntries is a request of one descriptor of many one-byte entries, as
// close to size bytes as they come: the most objects a message can decode
// to.
func manyEntries(size int) *rlsv3.RateLimitRequest {
	r := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{{}}}
	e := &ratelimitv3.RateLimitDescriptor_Entry{Key: "k", Value: "v"}
	n := (size - 16) / (proto.Size(e) + 2)
	for range n {
		r.Descriptors[0].Entries = append(r.Descriptors[0].Entries, e)
	}
	for proto.Size(r) > size {
		r.Descriptors[0].Entries = r.Descriptors[0].Entries[1:]
	}
	return r
}

// metric is the value of an unlabelled metric on url's /metrics.
func metric(t *testing.T, url, name string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return v
		}
	}
	return "?"
}

// vmRSS is a process's resident memory in KiB.
func vmRSS(t *testing.T, pid int) int64 {
	f := strings.Fields(strings.TrimPrefix(rss(t, pid), "VmRSS: "))
	var n int64
	for _, c := range f[0] {
		n = n*10 + int64(c-'0')
	}
	return n
}
