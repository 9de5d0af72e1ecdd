package bench_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protowire"
)

// A decider asks a rate-limit service for one decision on key (one hit):
// allowed, denied, or an error. The load loop drives every service through
// one, so what differs between the rows is the server.
type decider interface {
	decide(ctx context.Context, key string) (allowed bool, err error)
}

// rlsDecider is Envoy's rate-limit protocol (envoy.service.ratelimit.v3
// ShouldRateLimit) with go-control-plane's generated client on grpc-go, as
// an Envoy-like caller sends it: one descriptor [(desc, key)] in domain.
type rlsDecider struct {
	c            rlsv3.RateLimitServiceClient
	domain, desc string
}

func (r rlsDecider) decide(ctx context.Context, key string) (bool, error) {
	resp, err := r.c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
		Domain: r.domain,
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: r.desc, Value: key}},
		}},
	})
	if err != nil {
		return false, err
	}
	switch code := resp.GetOverallCode(); code {
	case rlsv3.RateLimitResponse_OK:
		return true, nil
	case rlsv3.RateLimitResponse_OVER_LIMIT:
		return false, nil
	default:
		return false, fmt.Errorf("ShouldRateLimit: overall code %v", code)
	}
}

// gubernatorDecider calls gubernator's pb.gubernator.V1/GetRateLimits with
// one request (a token bucket of limit hits per second, the request
// carrying its own limit as gubernator's API has it). The messages are
// written and read with protowire: gubernator's generated package would
// bring its server's dependencies into this module.
type gubernatorDecider struct {
	cc    *grpc.ClientConn
	limit int64
}

// Field numbers of gubernator.proto (v2.13.0).
const (
	gubReqs      = 1 // GetRateLimitsReq.requests, GetRateLimitsResp.responses
	gubName      = 1 // RateLimitReq
	gubUniqueKey = 2
	gubHits      = 3
	gubLimit     = 4
	gubDuration  = 5 // milliseconds
	gubStatus    = 1 // RateLimitResp: 0 UNDER_LIMIT, 1 OVER_LIMIT
	gubError     = 5
)

func (g gubernatorDecider) decide(ctx context.Context, key string) (bool, error) {
	var one []byte
	one = protowire.AppendTag(one, gubName, protowire.BytesType)
	one = protowire.AppendString(one, "perf")
	one = protowire.AppendTag(one, gubUniqueKey, protowire.BytesType)
	one = protowire.AppendString(one, key)
	one = protowire.AppendTag(one, gubHits, protowire.VarintType)
	one = protowire.AppendVarint(one, 1)
	one = protowire.AppendTag(one, gubLimit, protowire.VarintType)
	one = protowire.AppendVarint(one, uint64(g.limit))
	one = protowire.AppendTag(one, gubDuration, protowire.VarintType)
	one = protowire.AppendVarint(one, 1000)
	req := protowire.AppendTag(nil, gubReqs, protowire.BytesType)
	req = protowire.AppendBytes(req, one)
	var resp []byte
	if err := g.cc.Invoke(ctx, "/pb.gubernator.V1/GetRateLimits", &req, &resp, grpc.ForceCodec(rawCodec{})); err != nil {
		return false, err
	}
	return gubernatorAllowed(resp)
}

// gubernatorAllowed reads a GetRateLimitsResp of one response: allowed
// (UNDER_LIMIT), denied (OVER_LIMIT), or the error it carries.
func gubernatorAllowed(resp []byte) (bool, error) {
	var first []byte
	found := false
	if err := eachField(resp, func(num protowire.Number, _ uint64, b []byte) {
		if num == gubReqs && !found {
			first, found = b, true
		}
	}); err != nil {
		return false, err
	}
	if !found {
		return false, errors.New("GetRateLimits: no response")
	}
	status, msg := uint64(0), "" // an absent status is UNDER_LIMIT
	if err := eachField(first, func(num protowire.Number, v uint64, b []byte) {
		switch num {
		case gubStatus:
			status = v
		case gubError:
			msg = string(b)
		}
	}); err != nil {
		return false, err
	}
	switch {
	case msg != "":
		return false, fmt.Errorf("GetRateLimits: %s", msg)
	case status == 0:
		return true, nil
	case status == 1:
		return false, nil
	default:
		return false, fmt.Errorf("GetRateLimits: status %d", status)
	}
}

// eachField calls f with each field of the message b: its number and either
// its varint value or its bytes.
func eachField(b []byte, f func(num protowire.Number, v uint64, bytes []byte)) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		switch typ {
		case protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return protowire.ParseError(m)
			}
			f(num, v, nil)
			b = b[m:]
		case protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return protowire.ParseError(m)
			}
			f(num, 0, v)
			b = b[m:]
		default:
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return protowire.ParseError(m)
			}
			b = b[m:]
		}
	}
	return nil
}

// rawCodec passes messages already in wire form (*[]byte) through gRPC.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }

func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append((*v.(*[]byte))[:0], data...)
	return nil
}

// httpDecider is one keep-alive HTTP/1.1 connection to sluice's
// GET /allow?key=K (200 allowed, 429 denied), written and read by hand so
// that the client's CPU, on the cores it shares with the server, stays far
// below net/http's. Not safe for concurrent use: one per worker.
type httpDecider struct {
	addr string
	c    net.Conn
	br   *bufio.Reader
	buf  []byte
}

func (h *httpDecider) decide(ctx context.Context, key string) (bool, error) {
	if h.c == nil {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", h.addr)
		if err != nil {
			return false, err
		}
		h.c, h.br = c, bufio.NewReader(c)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = h.c.SetDeadline(dl)
	}
	status, err := h.get(key)
	if err != nil {
		h.close() // the next call dials afresh
		return false, err
	}
	switch status {
	case 200:
		return true, nil
	case 429:
		return false, nil
	default:
		return false, fmt.Errorf("/allow: status %d", status)
	}
}

func (h *httpDecider) get(key string) (int, error) {
	h.buf = append(h.buf[:0], "GET /allow?key="...)
	h.buf = append(h.buf, key...)
	h.buf = append(h.buf, " HTTP/1.1\r\nHost: "...)
	h.buf = append(h.buf, h.addr...)
	h.buf = append(h.buf, "\r\n\r\n"...)
	if _, err := h.c.Write(h.buf); err != nil {
		return 0, err
	}
	line, err := h.br.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	if len(line) < 12 {
		return 0, fmt.Errorf("status line %q", line)
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, fmt.Errorf("status line %q", line)
	}
	size := -1
	for {
		line, err := h.br.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		if len(line) <= 2 { // the blank line
			break
		}
		const cl = "content-length:"
		if len(line) > len(cl) && asciiLowerEqual(line[:len(cl)], cl) {
			size, err = strconv.Atoi(string(trimSpace(line[len(cl):])))
			if err != nil {
				return 0, fmt.Errorf("header %q", line)
			}
		}
	}
	if size < 0 {
		return 0, errors.New("response without Content-Length")
	}
	_, err = h.br.Discard(size)
	return status, err
}

func (h *httpDecider) close() {
	if h.c != nil {
		_ = h.c.Close()
		h.c = nil
	}
}

func asciiLowerEqual(b []byte, lower string) bool {
	for i := range b {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == '\r' || b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}

// loadShape is one run of the load loop: len(deciders) workers, each
// sending its next call when its last one returns (closed loop, the peak:
// rate 0), or each taking its turn in a fixed schedule of rate calls a
// second over all workers (open loop). Calls in the warm-up are not
// recorded.
type loadShape struct {
	rate     float64 // calls a second over all workers; 0: closed loop
	warmup   time.Duration
	duration time.Duration // measured
	keys     []string      // drawn at random, one per call
}

// loadResult is what one run measured.
type loadResult struct {
	lat                  []time.Duration // sorted; open loop: from each call's intended send time
	allowed, denied, bad int
	late                 int // open loop: calls sent lateBy or more after their intended time
	unsent               int // open loop: calls due in the measured time but not sent by its end
	calls                int // every call answered, warm-up included: what the CPU time counts
	firstErr             error
	duration             time.Duration
}

// lateBy is how far after its intended time a call must be sent to count
// as late: more than a timer's overshoot on an idle machine.
const lateBy = time.Millisecond

func (r *loadResult) decisionsPerSec() float64 {
	return float64(r.allowed+r.denied) / r.duration.Seconds()
}

// quantile is the q-quantile of the recorded latencies (0 when none).
func (r *loadResult) quantile(q float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	i := int(q*float64(len(r.lat))+0.5) - 1
	return r.lat[min(max(i, 0), len(r.lat)-1)]
}

// lateShare is the share of the open loop's calls sent late or not at all.
func (r *loadResult) lateShare() float64 {
	if len(r.lat)+r.unsent == 0 {
		return 0
	}
	return float64(r.late+r.unsent) / float64(len(r.lat)+r.unsent)
}

// add adds o's calls and duration to r (a row's rounds); sort r.lat after.
func (r *loadResult) add(o *loadResult) {
	r.lat = append(r.lat, o.lat...)
	r.allowed += o.allowed
	r.denied += o.denied
	r.bad += o.bad
	r.late += o.late
	r.unsent += o.unsent
	r.calls += o.calls
	if r.firstErr == nil {
		r.firstErr = o.firstErr
	}
	r.duration += o.duration
}

// runLoad drives the deciders (one per worker) with shape and returns what
// it measured. Every call is bounded by a deadline a few seconds past the
// run's end.
//
// Open loop: call n is due at start + n/rate, worker n mod workers sends it,
// and its latency runs from that due time, not from when it was sent: a
// call held up behind a slow one on its worker is charged the wait (no
// coordinated omission). The share sent late says whether the loop kept
// its schedule; a worker still behind at the run's end sends no more, and
// the calls it did not send count as late.
func runLoad(deciders []decider, shape loadShape) *loadResult {
	workers := len(deciders)
	start := time.Now().Add(20 * time.Millisecond)
	measured := start.Add(shape.warmup)
	end := measured.Add(shape.duration)
	ctx, cancel := context.WithDeadline(context.Background(), end.Add(5*time.Second))
	defer cancel()
	parts := make([]loadResult, workers)
	var wg sync.WaitGroup
	for w, d := range deciders {
		wg.Go(func() {
			p := &parts[w]
			rng := rand.New(rand.NewPCG(uint64(w), 26))
			time.Sleep(time.Until(start)) // the load's shape: start together
			for n := w; ; n += workers {
				var due time.Time
				if shape.rate > 0 {
					due = start.Add(time.Duration(float64(n) / shape.rate * float64(time.Second)))
					if !due.Before(end) {
						return
					}
					time.Sleep(time.Until(due)) // the schedule (returns at once when late)
					if !time.Now().Before(end) {
						// The run is over and this worker is behind: what it
						// did not send counts as sent late.
						for ; due.Before(end); n += workers {
							if !due.Before(measured) {
								p.unsent++
							}
							due = start.Add(time.Duration(float64(n+workers) / shape.rate * float64(time.Second)))
						}
						return
					}
				} else {
					due = time.Now()
					if !due.Before(end) {
						return
					}
				}
				sent := time.Now()
				ok, err := d.decide(ctx, shape.keys[rng.IntN(len(shape.keys))])
				done := time.Now()
				if err == nil {
					p.calls++
				}
				if due.Before(measured) || (shape.rate == 0 && done.After(end)) {
					continue
				}
				p.lat = append(p.lat, done.Sub(due))
				if sent.Sub(due) >= lateBy {
					p.late++
				}
				switch {
				case err != nil:
					p.bad++
					if p.firstErr == nil {
						p.firstErr = err
					}
				case ok:
					p.allowed++
				default:
					p.denied++
				}
			}
		})
	}
	wg.Wait()
	all := &loadResult{}
	for i := range parts {
		all.add(&parts[i])
	}
	all.duration = shape.duration
	slices.Sort(all.lat)
	return all
}

// grpcDeciders opens conns gRPC connections to addr and returns workers
// deciders spread over them (Envoy keeps a few long-lived HTTP/2
// connections and multiplexes its calls on them), and a func that closes
// the connections.
func grpcDeciders(addr string, conns, workers int, mk func(cc *grpc.ClientConn) decider) ([]decider, func(), error) {
	ccs := make([]*grpc.ClientConn, 0, conns)
	closeAll := func() {
		for _, cc := range ccs {
			_ = cc.Close()
		}
	}
	for range conns {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		ccs = append(ccs, cc)
	}
	ds := make([]decider, workers)
	for i := range ds {
		ds[i] = mk(ccs[i%conns])
	}
	return ds, closeAll, nil
}

// httpDeciders returns workers HTTP/1.1 deciders, a connection each, and a
// func that closes them.
func httpDeciders(addr string, workers int) ([]decider, func()) {
	hs := make([]*httpDecider, workers)
	ds := make([]decider, workers)
	for i := range hs {
		hs[i] = &httpDecider{addr: addr}
		ds[i] = hs[i]
	}
	return ds, func() {
		for _, h := range hs {
			h.close()
		}
	}
}
