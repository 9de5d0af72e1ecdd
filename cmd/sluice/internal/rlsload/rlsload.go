// Package rlsload is a lean load generator for Envoy's rate-limit gRPC
// service (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit): it
// drives a server as hard as it answers, closed loop, and counts the
// decisions it gets back.
//
// It speaks gRPC over cleartext HTTP/2 with prior knowledge (h2c, as Envoy's
// cleartext gRPC clusters do) on a few connections with several calls in
// flight on each, the request messages encoded before the run, each
// connection one goroutine that writes its calls and reads their answers.
// Why not grpc-go's client: on a machine whose cores the load generator
// shares with the server, a client that costs more CPU per call than the
// server leaves the server fewer cycles, so comparing peaks over gRPC and
// over HTTP/1.1 (measured with internal/loadgen, equally lean) would compare
// the clients. This one costs about what the server's transport does.
//
// Every answer is checked as a client must: the response HEADERS, the
// message (its overall_code decoded, so a call counts as a decision only if
// the server decided), and the trailers' grpc-status.
package rlsload

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/encoding/protowire"
)

// Method is the HTTP/2 :path of ShouldRateLimit.
const Method = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// RateLimitResponse.Code values (envoy.service.ratelimit.v3).
const (
	codeOK        = 1
	codeOverLimit = 2
)

// Config describes one run. Conns and Streams default to 4 each; a run
// starts calls until Duration has passed or Calls have been started,
// whichever comes first (at least one of the two must be set), then waits
// for the calls in flight.
type Config struct {
	Addr string // HOST:PORT of the server's gRPC listener
	// Requests are RateLimitRequest messages in protobuf wire form; the
	// i-th call of the run sends Requests[i%len(Requests)].
	Requests [][]byte
	Conns    int // HTTP/2 connections
	Streams  int // calls in flight on each connection
	Duration time.Duration
	Calls    int
}

// Result summarises a run.
type Result struct {
	OK, OverLimit int         // decisions: calls answered grpc-status 0 with that overall_code
	Status        map[int]int // calls per grpc-status (0 included)
	Failed        int         // calls reset, or answered without a grpc-status or with a bad message
	Elapsed       time.Duration
	latencies     []time.Duration // from the write of the call to its trailers, of decisions
}

// Decisions is the number of calls the server decided (OK or OVER_LIMIT).
func (r *Result) Decisions() int { return r.OK + r.OverLimit }

// Throughput is decisions per second.
func (r *Result) Throughput() float64 { return float64(r.Decisions()) / r.Elapsed.Seconds() }

// Quantile returns the q-quantile of the decisions' latencies.
func (r *Result) Quantile(q float64) time.Duration {
	if len(r.latencies) == 0 {
		return 0
	}
	i := int(q*float64(len(r.latencies))+0.5) - 1
	return r.latencies[min(max(i, 0), len(r.latencies)-1)]
}

// Run performs the run; it returns an error if a connection cannot be made
// or the server ends one (GOAWAY, a connection error, EOF) mid-run.
func Run(ctx context.Context, c Config) (*Result, error) {
	if c.Conns <= 0 {
		c.Conns = 4
	}
	if c.Streams <= 0 {
		c.Streams = 4
	}
	if len(c.Requests) == 0 {
		return nil, errors.New("rlsload: no requests")
	}
	if c.Duration <= 0 && c.Calls <= 0 {
		return nil, errors.New("rlsload: neither Duration nor Calls set")
	}
	// Each request framed once: the 5-byte gRPC message prefix (not
	// compressed, length) and the message.
	msgs := make([][]byte, len(c.Requests))
	for i, m := range c.Requests {
		b := make([]byte, 5+len(m))
		binary.BigEndian.PutUint32(b[1:], uint32(len(m)))
		copy(b[5:], m)
		msgs[i] = b
	}
	r := &run{cfg: c, msgs: msgs}
	for _, m := range msgs {
		r.maxMsg = max(r.maxMsg, len(m))
	}
	conns := make([]*conn, c.Conns)
	for i := range conns {
		cn, err := dial(ctx, r)
		if err != nil {
			for _, cn := range conns[:i] {
				cn.nc.Close()
			}
			return nil, err
		}
		conns[i] = cn
	}
	start := time.Now()
	r.end = start.Add(c.Duration)
	errs := make([]error, len(conns))
	var wg sync.WaitGroup
	for i, cn := range conns {
		wg.Go(func() {
			defer cn.nc.Close()
			stop := context.AfterFunc(ctx, func() { cn.nc.SetDeadline(time.Now()) })
			defer stop()
			errs[i] = cn.run()
		})
	}
	wg.Wait()
	res := &Result{Status: map[int]int{}, Elapsed: time.Since(start)}
	for _, cn := range conns {
		res.OK += cn.ok
		res.OverLimit += cn.over
		res.Failed += cn.failed
		for k, v := range cn.status {
			res.Status[k] += v
		}
		res.latencies = append(res.latencies, cn.lat...)
	}
	slices.Sort(res.latencies)
	return res, errors.Join(errs...)
}

// run is what the connections of one run share.
type run struct {
	cfg     Config
	msgs    [][]byte
	maxMsg  int // the longest of msgs
	end     time.Time
	started atomic.Int64 // calls started, all connections
}

// next returns the index of the next call's request, or false when the
// run starts no more calls.
func (r *run) next(now time.Time) (int, bool) {
	if r.cfg.Duration > 0 && now.After(r.end) {
		return 0, false
	}
	n := r.started.Add(1)
	if r.cfg.Calls > 0 && n > int64(r.cfg.Calls) {
		return 0, false
	}
	return int((n - 1) % int64(len(r.msgs))), true
}

// Flow-control windows this client gives the server. Why large: the
// answers are small and read at once, so a window that rarely runs low
// saves the server waiting for, and both sides handling, WINDOW_UPDATEs.
const (
	streamWindow = 1 << 20
	connWindow   = 1 << 30
)

type stream struct {
	sent   time.Time
	data   []byte
	status int // grpc-status, -1 until the trailers carry it
	bad    bool
}

type conn struct {
	r   *run
	nc  net.Conn
	br  *bufio.Reader
	bw  *bufio.Writer
	fr  *http2.Framer
	dec *hpack.Decoder
	cur *stream // the stream whose header block dec is decoding
	// curEnds: the HEADERS frame that began the block ended the stream
	// (trailers)
	curEnds bool

	hdrFirst, hdrNext []byte // the request's header block: the first call's, every later call's
	firstSent         bool
	nextID            uint32
	streams           map[uint32]*stream
	free              []*stream
	maxStreams        int   // calls in flight at most: Config.Streams, or fewer if the server says so
	sendWindow        int64 // connection-level window the server gives us
	recvUnacked       int64 // DATA bytes received and not yet returned in a WINDOW_UPDATE
	done              bool  // no more calls to start

	ok, over, failed int
	status           map[int]int
	lat              []time.Duration
}

func dial(ctx context.Context, r *run) (*conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", r.cfg.Addr)
	if err != nil {
		return nil, err
	}
	c := &conn{r: r, nc: nc, br: bufio.NewReaderSize(nc, 32<<10), bw: bufio.NewWriterSize(nc, 32<<10),
		nextID: 1, streams: map[uint32]*stream{}, maxStreams: r.cfg.Streams,
		sendWindow: 65535, status: map[int]int{}}
	c.fr = http2.NewFramer(c.bw, c.br)
	c.fr.SetReuseFrames()
	c.dec = hpack.NewDecoder(4096, c.onField)
	// Why encode the header block twice up front: the first encoding
	// enters :path, :authority, content-type and te into the server's
	// HPACK table; the second, sent on every later call, refers to them by
	// index, as a long-lived client's encoder does.
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for range 2 {
		hb.Reset()
		for _, f := range []hpack.HeaderField{
			{Name: ":method", Value: "POST"},
			{Name: ":scheme", Value: "http"},
			{Name: ":path", Value: Method},
			{Name: ":authority", Value: r.cfg.Addr},
			{Name: "content-type", Value: "application/grpc"},
			{Name: "te", Value: "trailers"},
		} {
			_ = enc.WriteField(f) // writes to a bytes.Buffer do not fail
		}
		if c.hdrFirst == nil {
			c.hdrFirst = bytes.Clone(hb.Bytes())
		} else {
			c.hdrNext = bytes.Clone(hb.Bytes())
		}
	}
	_, _ = c.bw.WriteString(http2.ClientPreface)
	_ = c.fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 0},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: streamWindow})
	_ = c.fr.WriteWindowUpdate(0, connWindow-65535)
	if err := c.bw.Flush(); err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

// run starts calls and reads answers until the run starts no more calls and
// none is in flight.
func (c *conn) run() error {
	c.fill()
	for len(c.streams) > 0 || !c.done {
		// Why flush only when nothing is left to read: the calls started
		// for every answer in one read go out in one write.
		if c.br.Buffered() == 0 {
			if err := c.bw.Flush(); err != nil {
				return err
			}
		}
		f, err := c.fr.ReadFrame()
		if err != nil {
			return fmt.Errorf("rlsload: %w", err)
		}
		if err := c.handle(f); err != nil {
			return err
		}
	}
	return c.bw.Flush()
}

func (c *conn) handle(f http2.Frame) error {
	id := f.Header().StreamID
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		if v, ok := f.Value(http2.SettingMaxConcurrentStreams); ok {
			c.maxStreams = min(c.r.cfg.Streams, int(v))
		}
		if v, ok := f.Value(http2.SettingInitialWindowSize); ok && int(v) < c.r.maxMsg {
			return fmt.Errorf("rlsload: server's stream window %d is smaller than a request", v)
		}
		return c.fr.WriteSettingsAck()
	case *http2.PingFrame:
		if !f.IsAck() {
			return c.fr.WritePing(true, f.Data)
		}
	case *http2.WindowUpdateFrame:
		if id == 0 {
			c.sendWindow += int64(f.Increment)
			c.fill()
		}
	case *http2.GoAwayFrame:
		return fmt.Errorf("rlsload: server sent GOAWAY %v %q", f.ErrCode, f.DebugData())
	case *http2.RSTStreamFrame:
		if s := c.streams[id]; s != nil {
			s.bad = true
			c.finish(id, s)
		}
	case *http2.HeadersFrame:
		c.curEnds = f.StreamEnded()
		return c.headers(id, f.HeaderBlockFragment(), f.HeadersEnded())
	case *http2.ContinuationFrame:
		return c.headers(id, f.HeaderBlockFragment(), f.HeadersEnded())
	case *http2.DataFrame:
		c.recvUnacked += int64(f.Header().Length)
		if c.recvUnacked >= connWindow/2 {
			if err := c.fr.WriteWindowUpdate(0, uint32(c.recvUnacked)); err != nil {
				return err
			}
			c.recvUnacked = 0
		}
		if s := c.streams[id]; s != nil {
			s.data = append(s.data, f.Data()...)
			if f.StreamEnded() { // a gRPC answer ends with trailers
				s.bad = true
				c.finish(id, s)
			}
		}
	}
	return nil
}

// headers decodes a header block fragment of stream id; the block's last
// fragment ends the call when its HEADERS frame ended the stream (the
// trailers).
func (c *conn) headers(id uint32, frag []byte, ended bool) error {
	s := c.streams[id]
	c.cur = s
	if s == nil {
		c.cur = &stream{} // still decoded: it updates the HPACK table
	}
	if _, err := c.dec.Write(frag); err != nil {
		return fmt.Errorf("rlsload: HPACK: %w", err)
	}
	if !ended {
		return nil
	}
	if err := c.dec.Close(); err != nil {
		return fmt.Errorf("rlsload: HPACK: %w", err)
	}
	c.cur = nil
	if c.curEnds && s != nil {
		c.finish(id, s)
	}
	return nil
}

func (c *conn) onField(f hpack.HeaderField) {
	s := c.cur
	switch f.Name {
	case ":status":
		if f.Value != "200" {
			s.bad = true
		}
	case "grpc-status":
		n, err := strconv.Atoi(f.Value)
		if err != nil || n < 0 {
			s.bad = true
			return
		}
		s.status = n
	}
}

// finish counts stream id's answer and starts the next calls.
func (c *conn) finish(id uint32, s *stream) {
	delete(c.streams, id)
	switch {
	case s.bad || s.status < 0:
		c.failed++
	case s.status != 0:
		c.status[s.status]++
	default:
		switch code, ok := overallCode(s.data); {
		case !ok:
			c.failed++
		case code == codeOK || code == codeOverLimit:
			c.status[0]++
			if code == codeOK {
				c.ok++
			} else {
				c.over++
			}
			c.lat = append(c.lat, time.Since(s.sent))
		default: // UNKNOWN: not a decision
			c.status[0]++
		}
	}
	c.free = append(c.free, s)
	c.fill()
}

// fill starts calls until maxStreams are in flight, the window is spent, or
// the run starts no more.
func (c *conn) fill() {
	for !c.done && len(c.streams) < c.maxStreams {
		if c.sendWindow < int64(c.r.maxMsg) {
			return // until the server's WINDOW_UPDATE
		}
		now := time.Now()
		i, ok := c.r.next(now)
		if !ok {
			c.done = true
			return
		}
		var s *stream
		if n := len(c.free); n > 0 {
			s, c.free = c.free[n-1], c.free[:n-1]
			*s = stream{data: s.data[:0]}
		} else {
			s = &stream{}
		}
		s.sent, s.status = now, -1
		id := c.nextID
		c.nextID += 2
		c.streams[id] = s
		hdr := c.hdrNext
		if !c.firstSent {
			hdr, c.firstSent = c.hdrFirst, true
		}
		// Writes go to c.bw; run flushes them, and a write error shows
		// there.
		_ = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hdr, EndHeaders: true})
		m := c.r.msgs[i]
		_ = c.fr.WriteData(id, true, m)
		c.sendWindow -= int64(len(m))
	}
}

// overallCode decodes a gRPC message (5-byte prefix, not compressed, then a
// RateLimitResponse) to its overall_code (field 1).
func overallCode(b []byte) (int, bool) {
	if len(b) < 5 || b[0] != 0 || int(binary.BigEndian.Uint32(b[1:])) != len(b)-5 {
		return 0, false
	}
	b = b[5:]
	code := 0 // proto3 default: UNKNOWN
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, false
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, false
			}
			code = int(v)
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, false
		}
		b = b[n:]
	}
	return code, true
}
