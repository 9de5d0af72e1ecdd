package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-go/sluice/internal/leasealloc"
	"github.com/sluice-go/sluice/lease"
)

// LeaseConfig configures the lease endpoint (POST /lease): a replica's
// renewal of all its keys at once, answered with a share of each key's
// policy (package lease is the replica's side; docs/leases.md the
// protocol). The policies a replica may lease are the server's: "default"
// (Config.Default) and the named policies of Config.Limits.
type LeaseConfig struct {
	// Lease is how long a grant is good for, Refresh how often replicas
	// renew (zero: leasealloc's defaults, 20 s and 5 s).
	Lease, Refresh time.Duration
	// Proportional splits a policy in proportion to demand instead of
	// max-min fair.
	Proportional bool
	// MaxHolders caps the holders of one key, MaxLeases the leases of the
	// server (zero: leasealloc's defaults).
	MaxHolders, MaxLeases int
	// NoLearning skips learning mode (leasealloc.Config.NoLearning): for a
	// server that knows no lease of its policies can be in force, such as
	// the first one ever started. A restarted server must learn: for one
	// lease length it grants only what renewing replicas show it holds.
	NoLearning bool
	// MaxInFlightBytes bounds the bytes of POST /lease bodies being read
	// at once, server-wide (zero: DefaultLeaseInFlightBytes); a body of
	// unknown length counts as the largest a request may be. A request
	// past it is answered 503 (code "busy") before its body is read.
	MaxInFlightBytes int64
	// Now is the clock (default time.Now); tests pass their own.
	Now func() time.Time
}

// DefaultLeaseInFlightBytes is LeaseConfig.MaxInFlightBytes when it is
// left zero: 64 MiB, as the gRPC port's -grpc-in-flight. Why a bound: a
// lease request may be 3,328,000 bytes (1,000 keys of three 1,024-byte
// names) and takes up to BodyTimeout to arrive, so without one each
// connection, and connections are not capped, could hold that much.
const DefaultLeaseInFlightBytes = 64 << 20

// leases is a Server's lease allocator and its metrics.
type leases struct {
	alloc *leasealloc.Allocator
	now   func() time.Time
	sweep time.Duration

	mu        sync.Mutex
	lastSweep time.Time // guarded by mu

	inFlight    atomic.Int64 // bytes of /lease bodies being read, as reserved
	maxInFlight int64

	renewals prometheus.Counter
	refused  *prometheus.CounterVec // code
}

func (s *Server) initLeases(c *LeaseConfig) error {
	if c == nil {
		return nil
	}
	now := c.Now
	if now == nil {
		now = time.Now
	}
	pols := map[string]leasealloc.Policy{}
	for _, p := range s.policyList() {
		pols[p.Name] = leasealloc.Policy{Rate: p.Rate, Burst: p.Burst}
	}
	algo := leasealloc.FairShare
	if c.Proportional {
		algo = leasealloc.Proportional
	}
	a, err := leasealloc.New(leasealloc.Config{Policies: pols, Lease: c.Lease, Refresh: c.Refresh,
		Algorithm: algo, MaxHolders: c.MaxHolders, MaxLeases: c.MaxLeases, NoLearning: c.NoLearning}, now())
	if err != nil {
		return fmt.Errorf("service: leases: %w", err)
	}
	if c.MaxInFlightBytes < 0 {
		return fmt.Errorf("service: leases: MaxInFlightBytes %d: must not be negative", c.MaxInFlightBytes)
	}
	maxInFlight := c.MaxInFlightBytes
	if maxInFlight == 0 {
		maxInFlight = DefaultLeaseInFlightBytes
	}
	l := &leases{alloc: a, now: now, sweep: a.Config().Lease, lastSweep: now(), maxInFlight: maxInFlight,
		renewals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_lease_renewals_total",
			Help: "Lease requests answered (each renews all the keys of one replica).",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_lease_refused_total",
			Help: "Lease keys or whole requests refused, by code (bad_request, bad_demand, unknown_policy, too_many_keys, too_many_holders, not_held, busy).",
		}, []string{"code"}),
	}
	holders := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_lease_leases",
		Help: "Leases held now (a replica's lease on one key), capped by -lease-max-leases.",
	}, func() float64 { return float64(a.Stats().Leases) })
	s.cfg.Registry.MustRegister(l.renewals, l.refused, holders)
	s.leases = l
	return nil
}

// handleLease answers POST /lease: a lease.Request as JSON, a
// lease.Response as JSON. A request the allocator refuses as a whole is
// 400 (413 for too many keys) with {"error": …, "code": …}.
func (s *Server) handleLease(w http.ResponseWriter, r *http.Request) {
	if s.leases == nil {
		s.fail(w, http.StatusNotFound, "leases are off on this server")
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		s.fail(w, http.StatusMethodNotAllowed, "method %s not allowed on /lease: POST a JSON lease request", r.Method)
		return
	}
	if s.clients != nil && !s.allowHTTP(w, r) {
		return
	}
	// A request carries at most MaxKeys keys of at most three names each.
	limit := int64(leasealloc.DefaultMaxKeys) * (3*leasealloc.MaxNameLen + 256)
	// Reserve the body's bytes before reading it: its length when known
	// (the server reads no more), else the most a request may be.
	n := limit
	if 0 <= r.ContentLength && r.ContentLength < limit {
		n = r.ContentLength
	}
	if s.leases.inFlight.Add(n) > s.leases.maxInFlight {
		s.leases.inFlight.Add(-n)
		s.leases.refused.WithLabelValues("busy").Inc()
		w.Header().Set("Retry-After", "1")
		s.failCode(w, http.StatusServiceUnavailable, "busy", "lease requests being read pass %d bytes; retry", s.leases.maxInFlight)
		return
	}
	defer s.leases.inFlight.Add(-n)
	if r.ContentLength != 0 {
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout))
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			s.fail(w, http.StatusRequestEntityTooLarge, "lease request over %d bytes", tooBig.Limit)
			return
		}
		s.fail(w, http.StatusBadRequest, "reading body: %v", err)
		return
	}
	var req lease.Request
	if err := json.Unmarshal(body, &req); err != nil {
		s.leases.refused.WithLabelValues("bad_request").Inc()
		s.failCode(w, http.StatusBadRequest, "bad_request", "lease request: %v", err)
		return
	}
	now := s.leases.now()
	resp, err := s.leases.alloc.RenewAt(now, &req)
	if err != nil {
		code := lease.Code(err)
		s.leases.refused.WithLabelValues(code).Inc()
		status := http.StatusBadRequest
		if errors.Is(err, lease.ErrTooManyKeys) {
			status = http.StatusRequestEntityTooLarge
		}
		s.failCode(w, status, code, "%v", err)
		return
	}
	s.leases.count(resp)
	s.leases.maybeSweep(now)
	writeJSON(w, http.StatusOK, resp)
}

// maybeSweep drops ended leases once a lease length, so replicas that
// vanished free their memory without a goroutine of their own.
func (l *leases) maybeSweep(now time.Time) {
	l.mu.Lock()
	due := now.Sub(l.lastSweep) >= l.sweep
	if due {
		l.lastSweep = now
	}
	l.mu.Unlock()
	if due {
		l.alloc.SweepAt(now)
	}
}

// failCode is fail with a machine-readable code beside the message.
func (s *Server) failCode(w http.ResponseWriter, status int, code, format string, args ...any) {
	s.metrics.badRequests.WithLabelValues(fmt.Sprint(status)).Inc()
	writeJSON(w, status, map[string]string{"error": fmt.Sprintf(format, args...), "code": code})
}

// RenewLease answers one lease request, as POST /lease does (counted in
// the same metrics): for the gRPC Leases service (package leasegrpc). With
// leases off it refuses every request (lease.ErrBadRequest); with
// Config.ClientNames, a caller they do not name gets PermissionDenied.
func (s *Server) RenewLease(ctx context.Context, req *lease.Request) (*lease.Response, error) {
	if s.clients != nil {
		if err := s.allowGRPC(ctx); err != nil {
			return nil, err
		}
	}
	if s.leases == nil {
		return nil, lease.Err("bad_request", "leases are off on this server (-leases=false)")
	}
	now := s.leases.now()
	resp, err := s.leases.alloc.RenewAt(now, req)
	if err != nil {
		s.leases.refused.WithLabelValues(lease.Code(err)).Inc()
		return nil, err
	}
	s.leases.count(resp)
	s.leases.maybeSweep(now)
	return resp, nil
}

// count counts an answered request and its refused keys.
func (l *leases) count(resp *lease.Response) {
	l.renewals.Inc()
	for i := range resp.Keys {
		if c := resp.Keys[i].Error; c != "" {
			l.refused.WithLabelValues(c).Inc()
		}
	}
}
