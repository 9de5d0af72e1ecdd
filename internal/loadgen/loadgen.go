// Package loadgen is a small HTTP/1.1 load generator for measuring the
// service on loopback: open-loop at a fixed rate, or closed-loop as fast as
// it can (peak throughput).
//
// At a fixed rate, a request that found its connection still waiting for the
// previous response is timed from its scheduled time, so a slow response is
// charged to every request it holds up (no coordinated omission). A request
// that found its connection free is timed from its send, so the generator's
// own timer lateness (a Go sleep can overshoot by up to a millisecond, since
// the runtime's poller waits in whole milliseconds) is not charged to the
// server. It speaks raw HTTP/1.1 over keep-alive connections so that the
// generator costs as little CPU as possible on the machine it shares with the
// server.
package loadgen

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Config describes one run.
type Config struct {
	Addr     string             // HOST:PORT
	Path     func(i int) string // request path of the i-th request, e.g. /allow?key=k7
	Rate     float64            // requests per second; 0 means as fast as possible (closed loop)
	Duration time.Duration
	Conns    int // keep-alive connections (default 16)
}

// Result summarises a run.
type Result struct {
	Sent, Errors int
	Status       map[int]int
	Elapsed      time.Duration
	latencies    []time.Duration // see the package doc
	service      []time.Duration // from the moment it was written
}

// Throughput is completed requests per second.
func (r *Result) Throughput() float64 { return float64(r.Sent-r.Errors) / r.Elapsed.Seconds() }

// Quantile returns the q-quantile of latencies.
func (r *Result) Quantile(q float64) time.Duration {
	if len(r.latencies) == 0 {
		return 0
	}
	i := int(q*float64(len(r.latencies))+0.5) - 1
	return r.latencies[min(max(i, 0), len(r.latencies)-1)]
}

// ServiceQuantile is Quantile measured from when each request was written:
// the bare round trip, leaving out any wait for the connection.
func (r *Result) ServiceQuantile(q float64) time.Duration {
	if len(r.service) == 0 {
		return 0
	}
	i := int(q*float64(len(r.service))+0.5) - 1
	return r.service[min(max(i, 0), len(r.service)-1)]
}

func (r *Result) String() string {
	us := func(d time.Duration) string { return fmt.Sprintf("%.0fµs", float64(d)/1e3) }
	return fmt.Sprintf("%d requests in %.2fs = %.0f req/s, errors %d, status %v; latency p50=%s p90=%s p99=%s p99.9=%s max=%s; from send p50=%s p99=%s",
		r.Sent, r.Elapsed.Seconds(), r.Throughput(), r.Errors, r.Status,
		us(r.Quantile(0.5)), us(r.Quantile(0.9)), us(r.Quantile(0.99)), us(r.Quantile(0.999)), us(r.Quantile(1)),
		us(r.ServiceQuantile(0.5)), us(r.ServiceQuantile(0.99)))
}

// Run performs the run and returns its result.
func Run(ctx context.Context, c Config) (*Result, error) {
	if c.Conns <= 0 {
		c.Conns = 16
	}
	type part struct {
		sent, errors int
		status       map[int]int
		lat, svc     []time.Duration
	}
	parts := make([]part, c.Conns)
	conns := make([]*conn, c.Conns)
	for i := range conns {
		cn, err := dial(c.Addr)
		if err != nil {
			return nil, err
		}
		defer cn.Close()
		conns[i] = cn
	}
	start := time.Now().Add(10 * time.Millisecond)
	end := start.Add(c.Duration)
	var wg sync.WaitGroup
	for w := range c.Conns {
		wg.Go(func() {
			p := &parts[w]
			p.status = make(map[int]int)
			cn := conns[w]
			var free time.Time // when this connection's previous response arrived
			for k := 0; ; k++ {
				i := k*c.Conns + w // global request number
				var due time.Time
				if c.Rate > 0 {
					due = start.Add(time.Duration(float64(i) / c.Rate * float64(time.Second)))
					if due.After(end) || ctx.Err() != nil {
						return
					}
					if d := time.Until(due); d > 0 {
						time.Sleep(d)
					}
				} else {
					due = time.Now()
					if due.After(end) || ctx.Err() != nil {
						return
					}
				}
				p.sent++
				sent := time.Now()
				status, err := cn.get(c.Path(i))
				if err != nil {
					p.errors++
					if cn, err = dial(c.Addr); err != nil {
						return
					}
					conns[w] = cn
					continue
				}
				now := time.Now()
				// Charged from the schedule when the previous response on
				// this connection came after it (the server held this
				// request up), else from the send (the connection was free;
				// any lateness was the generator's timer).
				from := sent
				if free.After(due) {
					from = due
				}
				free = now
				p.lat = append(p.lat, now.Sub(from))
				p.svc = append(p.svc, now.Sub(sent))
				p.status[status]++
			}
		})
	}
	wg.Wait()
	r := &Result{Status: make(map[int]int), Elapsed: time.Since(start)}
	if c.Rate > 0 {
		r.Elapsed = c.Duration
	}
	for _, p := range parts {
		r.Sent += p.sent
		r.Errors += p.errors
		for k, v := range p.status {
			r.Status[k] += v
		}
		r.latencies = append(r.latencies, p.lat...)
		r.service = append(r.service, p.svc...)
	}
	slices.Sort(r.latencies)
	slices.Sort(r.service)
	return r, nil
}

type conn struct {
	net.Conn
	br   *bufio.Reader
	host string
	buf  []byte
}

func dial(addr string) (*conn, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &conn{Conn: c, br: bufio.NewReaderSize(c, 8192), host: addr}, nil
}

// get sends one GET and reads the whole response; it returns the status.
func (c *conn) get(path string) (int, error) {
	c.buf = append(c.buf[:0], "GET "...)
	c.buf = append(c.buf, path...)
	c.buf = append(c.buf, " HTTP/1.1\r\nHost: "...)
	c.buf = append(c.buf, c.host...)
	c.buf = append(c.buf, "\r\n\r\n"...)
	if _, err := c.Write(c.buf); err != nil {
		return 0, err
	}
	line, err := c.br.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	if len(line) < 12 {
		return 0, fmt.Errorf("bad status line %q", line)
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, fmt.Errorf("bad status line %q", line)
	}
	length := -1
	for {
		h, err := c.br.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		if len(h) <= 2 {
			break
		}
		if k, v, ok := strings.Cut(string(h), ":"); ok && strings.EqualFold(k, "Content-Length") {
			length, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	if length < 0 {
		return 0, fmt.Errorf("response without Content-Length")
	}
	if _, err := c.br.Discard(length); err != nil {
		return 0, err
	}
	return status, nil
}
