package main_test

import (
	"bufio"
	"bytes"
	"context"
	binenc "encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-go/sluice/cmd/sluice/internal/h2grpc"
	"github.com/sluice-go/sluice/cmd/sluice/internal/rlsload"
	"github.com/sluice-go/sluice/internal/loadgen"
)

// bareServerEnv names, in a child of this test binary, the bare server it
// runs instead of the tests (see TestMeasureGRPCTransports).
const bareServerEnv = "SLUICE_BARE_SERVER"

// Why init and not TestMain: the child must serve before TestMain builds
// the sluice binary, and exit without running a test.
func init() {
	if kind := os.Getenv(bareServerEnv); kind != "" {
		runBareServer(kind)
		os.Exit(0)
	}
}

// bareKinds are the transports TestMeasureGRPCTransports compares, each
// answering a fixed decision without a store:
//   - http1: net/http over HTTP/1.1, GET /allow?key=… (what /allow's
//     transport costs);
//   - grpc-go: grpc-go serving ShouldRateLimit with the options `serve
//     -grpc` uses (fixed flow-control windows, 100 streams, stream workers);
//   - nethttp-h2c: net/http's own HTTP/2 server (cleartext, prior
//     knowledge) with a handler that reads the gRPC frame and answers it
//     with grpc-status in a trailer, the shape grpc-go's ServeHTTP would
//     share;
//   - h2-inline: a hand-written HTTP/2 loop of one goroutine per
//     connection (x/net/http2's Framer and HPACK), each call answered on the
//     reading goroutine, its frames written with the next read's;
//   - h2-per-call: the same with each call answered on a goroutine of its
//     own (what a store call that blocks, Redis's, would need);
//   - h2grpc: the transport `serve -grpc` uses (internal/h2grpc, the same
//     windows and stream cap as grpc-go's row), the service's handler
//     decoding the request.
var bareKinds = []string{"http1", "grpc-go", "nethttp-h2c", "h2-inline", "h2-per-call", "h2grpc"}

// TestMeasureGRPCTransports measures the CPU per call of bare servers, one
// child process each, driven closed loop in turn: the HTTP/1.1 one by
// loadgen (as /allow in TestMeasureGRPCvsHTTP), the others by rlsload with
// the same 1000 requests. It logs each run's calls/s, CPU, read and write
// syscalls per call (from /proc), and each round's CPU per call ÷ http1's.
// It answers whether replacing grpc-go's transport for ShouldRateLimit
// would bring a call's cost to /allow's: net/http's HTTP/2 server costs
// about twice grpc-go's (three frames written, five reads a call), a
// hand-written loop less than HTTP/1.1. It runs only with SLUICE_MEASURE=1:
//
//	SLUICE_MEASURE=1 go test -run MeasureGRPCTransports -v -count=1 ./cmd/sluice
//
// SLUICE_MEASURE_CONNS (default 32) connections, SLUICE_MEASURE_STREAMS
// (default 1) calls in flight on each HTTP/2 one, SLUICE_MEASURE_SECS
// (default 5), SLUICE_MEASURE_ROUNDS (default 3).
func TestMeasureGRPCTransports(t *testing.T) {
	if os.Getenv("SLUICE_MEASURE") == "" {
		t.Skip("set SLUICE_MEASURE=1 to measure")
	}
	secs := time.Duration(envInt("SLUICE_MEASURE_SECS", 5)) * time.Second
	rounds := envInt("SLUICE_MEASURE_ROUNDS", 3)
	conns := envInt("SLUICE_MEASURE_CONNS", 32)
	streams := envInt("SLUICE_MEASURE_STREAMS", 1)
	reqs := make([][]byte, 1000)
	for i := range reqs {
		b, err := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "http", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "key", Value: "k" + strconv.Itoa(i)}}}}})
		require.NoError(t, err)
		reqs[i] = b
	}
	type child struct {
		pid  int
		addr string
	}
	children := map[string]child{}
	for _, kind := range bareKinds {
		pid, addr := startBareServer(t, kind)
		children[kind] = child{pid, addr}
	}
	cpuRatio := map[string][]float64{}
	for round := range rounds {
		cpuPer := map[string]float64{}
		for _, kind := range bareKinds { // in turn, so drift on a shared machine hits all
			c := children[kind]
			c0, _ := processCPU(c.pid)
			r0, w0 := processSyscalls(c.pid)
			var n int
			var rate float64
			if kind == "http1" {
				h, err := loadgen.Run(context.Background(), loadgen.Config{Addr: c.addr, Conns: conns,
					Path: func(i int) string { return "/allow?key=k" + strconv.Itoa(i%1000) }, Duration: secs})
				require.NoError(t, err)
				require.Zero(t, h.Errors)
				n, rate = h.Sent, h.Throughput()
			} else {
				l, err := rlsload.Run(context.Background(), rlsload.Config{Addr: c.addr, Conns: conns, Streams: streams,
					Requests: reqs, Duration: secs})
				require.NoError(t, err)
				require.Zero(t, l.Failed)
				require.Equal(t, l.Decisions(), l.Status[0])
				n, rate = l.Decisions(), l.Throughput()
			}
			c1, _ := processCPU(c.pid)
			r1, w1 := processSyscalls(c.pid)
			require.Positive(t, n)
			cpuPer[kind] = float64(c1-c0) / float64(n) / 1e3
			t.Logf("round %d %-11s %6.0f calls/s, server CPU %5.1fµs, %.2f reads, %.2f writes per call",
				round+1, kind, rate, cpuPer[kind], float64(r1-r0)/float64(n), float64(w1-w0)/float64(n))
		}
		var line strings.Builder
		for _, kind := range bareKinds[1:] {
			r := cpuPer[kind] / cpuPer["http1"]
			cpuRatio[kind] = append(cpuRatio[kind], r)
			fmt.Fprintf(&line, " %s %.2f", kind, r)
		}
		t.Logf("round %d CPU per call ÷ http1's:%s", round+1, line.String())
	}
	var line strings.Builder
	for _, kind := range bareKinds[1:] {
		x := slices.Clone(cpuRatio[kind])
		slices.Sort(x)
		fmt.Fprintf(&line, " %s %.2f", kind, x[len(x)/2])
	}
	t.Logf("median CPU per call ÷ http1's:%s", line.String())
}

// startBareServer starts this test binary as the bare server kind and
// returns its pid and address; the child ends when the test does (its
// stdin closes).
func startBareServer(t *testing.T, kind string) (int, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), bareServerEnv+"="+kind)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, kind)
	return cmd.Process.Pid, strings.TrimSpace(line)
}

// processSyscalls is the read and write system calls process pid has
// made (/proc/PID/io; zeros where there is none).
func processSyscalls(pid int) (reads, writes int) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/io")
	if err != nil {
		return 0, 0
	}
	for l := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(l, "syscr: "); ok {
			reads, _ = strconv.Atoi(strings.TrimSpace(v))
		}
		if v, ok := strings.CutPrefix(l, "syscw: "); ok {
			writes, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return reads, writes
}

// bareAnswer is every bare server's decision.
var bareAnswer = &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
	Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 999}}}

// runBareServer serves kind on a loopback port, writes the address to
// stdout, and returns when stdin closes.
func runBareServer(kind string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	fmt.Println(ln.Addr().String())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	switch kind {
	case "http1":
		_ = (&http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_ = r.URL.Query().Get("key")
			w.Header()["Content-Type"] = []string{"application/json"}
			_, _ = w.Write([]byte(`{"allowed":true,"remaining":999}` + "\n"))
		})}).Serve(ln)
	case "grpc-go":
		g := grpc.NewServer(grpc.StaticStreamWindowSize(64<<10), grpc.StaticConnWindowSize(1<<20),
			grpc.MaxConcurrentStreams(100), grpc.NumStreamWorkers(uint32(32*runtime.GOMAXPROCS(0))))
		rlsv3.RegisterRateLimitServiceServer(g, bareRLS{})
		_ = g.Serve(ln)
	case "h2grpc":
		s := h2grpc.New(h2grpc.Config{StreamWindow: 64 << 10, ConnWindow: 1 << 20, MaxStreams: 100}, 32*runtime.GOMAXPROCS(0))
		rlsv3.RegisterRateLimitServiceServer(s, bareRLS{})
		_ = s.Serve(ln, nil)
	case "nethttp-h2c":
		s := &http.Server{Handler: http.HandlerFunc(bareGRPCHandler), HTTP2: &http.HTTP2Config{MaxConcurrentStreams: 100}}
		s.Protocols = new(http.Protocols)
		s.Protocols.SetUnencryptedHTTP2(true)
		_ = s.Serve(ln)
	case "h2-inline", "h2-per-call":
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serveBareH2(c, kind == "h2-per-call")
		}
	default:
		panic("unknown bare server " + kind)
	}
}

type bareRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (bareRLS) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return bareAnswer, nil
}

// bareReply is a decoded request's framed answer, nil if req is not a
// framed RateLimitRequest.
func bareReply(req []byte) []byte {
	var m rlsv3.RateLimitRequest
	if len(req) < 5 || proto.Unmarshal(req[5:], &m) != nil {
		return nil
	}
	out, _ := proto.MarshalOptions{}.MarshalAppend(make([]byte, 5, 64), bareAnswer)
	binenc.BigEndian.PutUint32(out[1:], uint32(len(out)-5))
	return out
}

// bareGRPCHandler answers one unary gRPC call over net/http.
func bareGRPCHandler(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	out := bareReply(body)
	if err != nil || out == nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	h := w.Header()
	h["Content-Type"] = []string{"application/grpc"}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
	h[http.TrailerPrefix+"Grpc-Status"] = []string{"0"}
}

// serveBareH2 serves gRPC calls on one cleartext HTTP/2 connection with a
// single reading goroutine (perCall: each call answered on a goroutine of
// its own). It does what rlsload needs and no more: no limits, no
// deadlines, no stream windows (a request fits the default one).
func serveBareH2(nc net.Conn, perCall bool) {
	defer nc.Close()
	br, bw := bufio.NewReaderSize(nc, 16<<10), bufio.NewWriterSize(nc, 16<<10)
	var preface [len(http2.ClientPreface)]byte
	if _, err := io.ReadFull(br, preface[:]); err != nil || string(preface[:]) != http2.ClientPreface {
		return
	}
	fr := http2.NewFramer(bw, br)
	fr.SetReuseFrames()
	const connWindow = 1 << 20
	_ = fr.WriteSettings(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 100})
	_ = fr.WriteWindowUpdate(0, connWindow-65535)
	var (
		mu      sync.Mutex // the writer's (perCall)
		hb      bytes.Buffer
		enc     = hpack.NewEncoder(&hb)
		rlsPath bool // the header block being decoded names ShouldRateLimit
		dec     = hpack.NewDecoder(4096, func(f hpack.HeaderField) {
			if f.Name == ":path" {
				rlsPath = f.Value == rlsload.Method
			}
		})
		bodies  = map[uint32][]byte{}
		unacked int
	)
	// flush writes what is buffered: inline, only once no frame waits to
	// be read, so that the answers to one read go out in one write; per
	// call, always (the reader's buffer is not the writer's to look at).
	flush := func() {
		if perCall || br.Buffered() == 0 {
			_ = bw.Flush()
		}
	}
	answer := func(id uint32, req []byte) {
		out := bareReply(req)
		if perCall {
			mu.Lock()
			defer mu.Unlock()
			defer flush()
		}
		if out == nil {
			_ = fr.WriteRSTStream(id, http2.ErrCodeProtocol)
			return
		}
		hb.Reset()
		_ = enc.WriteField(hpack.HeaderField{Name: ":status", Value: "200"})
		_ = enc.WriteField(hpack.HeaderField{Name: "content-type", Value: "application/grpc"})
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true})
		_ = fr.WriteData(id, false, out)
		hb.Reset()
		_ = enc.WriteField(hpack.HeaderField{Name: "grpc-status", Value: "0"})
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true, EndStream: true})
	}
	write := func(f func()) {
		if perCall {
			mu.Lock()
			defer mu.Unlock()
			defer flush()
		}
		f()
	}
	for {
		if !perCall {
			flush()
		}
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		id := f.Header().StreamID
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				write(func() { _ = fr.WriteSettingsAck() })
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				write(func() { _ = fr.WritePing(true, f.Data) })
			}
		case *http2.HeadersFrame: // one frame: rlsload's header block is small
			rlsPath = false
			if _, err := dec.Write(f.HeaderBlockFragment()); err != nil || dec.Close() != nil {
				return
			}
			if !rlsPath {
				write(func() { _ = fr.WriteRSTStream(id, http2.ErrCodeRefusedStream) })
				continue
			}
			bodies[id] = nil
		case *http2.DataFrame:
			body, ok := bodies[id]
			if !ok {
				continue
			}
			body = append(body, f.Data()...)
			if unacked += len(f.Data()); unacked >= connWindow/2 {
				n := unacked
				write(func() { _ = fr.WriteWindowUpdate(0, uint32(n)) })
				unacked = 0
			}
			if !f.StreamEnded() {
				bodies[id] = body
				continue
			}
			delete(bodies, id)
			if perCall {
				go answer(id, body)
			} else {
				answer(id, body)
			}
		}
	}
}
