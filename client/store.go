package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/store"
)

// Store is a running service seen as a store.Store, so code written against
// stores (the httplimit middleware, for one) can share the service's limits
// across hosts without a Redis of its own. Create it with Client.Store; it
// is safe for concurrent use.
//
// The service decides with its own policy for each key (its -rate, -burst
// and -limits); /allow takes no policy. So Allow checks the rate and burst
// of the service's answer against the Policy passed and, when they differ,
// returns an error wrapping ErrPolicyMismatch that names both, instead of a
// decision made under a limit the caller did not ask for (the service has
// counted the request all the same). Under the httplimit middleware that
// error takes the middleware's fail mode: start the service with the
// middleware's policy for those keys (-rate and -burst, or -limits). A reply the service could make only
// without its own store (its "degraded" answers) is returned as an error
// wrapping ErrUnavailable, so the caller's own fail mode applies.
type Store struct {
	c      *Client
	closed atomic.Bool
}

// ErrPolicyMismatch is wrapped by the error Store.Allow returns when the
// service's policy for the key (its rate and burst, in its answer) is not
// the Policy the caller passed.
var ErrPolicyMismatch = errors.New("client: the service's policy for the key is not the caller's")

// Store returns the service as a store.Store. Closing the Store releases
// the client's idle connections; the Client stays usable.
func (c *Client) Store() *Store { return &Store{c: c} }

var _ store.Store = (*Store)(nil)

// Allow implements store.Store with one /allow request (or none, while a
// denial of key is cached).
func (s *Store) Allow(ctx context.Context, key string, cost int64, p store.Policy) (store.Result, error) {
	if s.closed.Load() {
		return store.Result{}, store.ErrClosed
	}
	if err := store.Check(cost, p); err != nil {
		return store.Result{}, err
	}
	d, err := s.c.Allow(ctx, key, cost)
	if err != nil {
		var re *RequestError
		if errors.As(err, &re) && d.Limit > 0 && cost > d.Limit {
			return store.Result{}, fmt.Errorf("%w: %w", store.ErrCostExceedsBurst, err)
		}
		return store.Result{}, err
	}
	if d.Degraded != "" {
		return store.Result{}, fmt.Errorf("%w: service answered without its store: %s", ErrUnavailable, d.Degraded)
	}
	if d.Limit > 0 && d.Rate > 0 && (d.Limit != p.Burst || math.Abs(d.Rate-p.Rate) > 1e-9*p.Rate) {
		// Why a relative tolerance: the rate comes back through JSON, which
		// round-trips a float64 exactly in Go, but another server may not.
		return store.Result{}, fmt.Errorf("%w: for key %q the service enforces rate %v burst %d, the caller asked for rate %v burst %d",
			ErrPolicyMismatch, key, d.Rate, d.Limit, p.Rate, p.Burst)
	}
	r := store.Result{Allowed: d.Allowed, Remaining: d.Remaining}
	if !d.Allowed {
		r.RetryAfter = max(d.RetryAfter, time.Millisecond)
	}
	if d.Rate > 0 && d.Limit > 0 {
		// The service does not send reset-after; it follows from the bucket:
		// the missing tokens at the key's rate.
		r.ResetAfter = time.Duration(max(0, float64(d.Limit)-d.Remaining) / d.Rate * float64(time.Second))
	}
	return r, nil
}

// Keys implements store.Store: the key count the service's /stats reports.
func (s *Store) Keys(ctx context.Context) (int64, error) {
	var st struct {
		Keys       int64  `json:"keys"`
		StoreError string `json:"store_error"`
	}
	body, err := s.get(ctx, "/stats")
	if err != nil {
		return 0, err
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return 0, fmt.Errorf("%w: bad /stats reply %q: %v", ErrUnavailable, truncate(body), err)
	}
	if st.StoreError != "" {
		return 0, fmt.Errorf("%w: %s", ErrUnavailable, st.StoreError)
	}
	return st.Keys, nil
}

// Ping implements store.Store: the service's /healthz.
func (s *Store) Ping(ctx context.Context) error {
	_, err := s.get(ctx, "/healthz")
	return err
}

func (s *Store) get(ctx context.Context, path string) ([]byte, error) {
	if s.closed.Load() {
		return nil, store.ErrClosed
	}
	if s.c.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.c.timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.c.base+path, nil)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	resp, err := s.c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%w: %s: status %d: %s", ErrUnavailable, path, resp.StatusCode, truncate(body))
	}
	return body, nil
}

// Name implements store.Store.
func (s *Store) Name() string { return "service" }

// Close implements store.Store: later calls return store.ErrClosed.
func (s *Store) Close() error {
	if s.closed.CompareAndSwap(false, true) {
		s.c.Close()
	}
	return nil
}
