package service

import (
	"context"
	"errors"
	"net/http"

	"github.com/sluice-go/sluice/internal/monotime"
	"github.com/sluice-go/sluice/store"
)

// verdict is the outcome of one decision, shared by /allow and Envoy's
// ShouldRateLimit.
type verdict struct {
	res store.Result // the store's figures; zero when degraded
	// allowed is the answer to give: the store's decision, overridden to
	// true by shadow mode (shadowDenied) or by -fail open (degraded).
	allowed      bool
	shadowDenied bool // the store denied; shadow mode answers allowed
	degraded     bool // the store failed; allowed follows FailOpen
}

// decide is the one decision path of both APIs: it asks the store whether
// key may spend cost tokens under e (bounded by StoreTimeout), records the
// store latency, counts the outcome in e's metrics and the totals, and applies
// shadow mode and the fail mode. The error is non-nil only when no answer is
// due: the caller's ctx ended (the client left), or cost exceeds the burst
// (store.ErrCostExceedsBurst, which callers check first).
func (s *Server) decide(ctx context.Context, key string, cost int64, e *policyEntry, shadow bool) (verdict, error) {
	sctx := ctx
	if !s.inProcess {
		var cancel context.CancelFunc
		sctx, cancel = context.WithTimeout(ctx, s.cfg.StoreTimeout)
		defer cancel()
	}
	// Why monotime and not time.Now: the metric needs only the monotonic
	// clock, and time.Now also reads the wall clock, which made these two
	// readings a tenth of the handler's time for the memory store.
	start := monotime.Now()
	res, err := s.cfg.Store.Allow(sctx, key, cost, e.p)
	s.storeLat.Observe(float64(monotime.Now()-start) / 1e9)
	if err != nil {
		if ctx.Err() != nil {
			// The client went away mid-call: not the store's fault, and
			// nobody is left to answer; count it so it is not lost.
			s.canceled.Add(1)
			e.counters.canceled.Inc()
			return verdict{}, ctx.Err()
		}
		if errors.Is(err, store.ErrCostExceedsBurst) {
			return verdict{}, err
		}
		s.storeErr.Inc()
		s.degraded.Add(1)
		e.counters.storeError.Inc()
		if s.storeDown.CompareAndSwap(false, true) {
			s.log.Error("store failing; answering per -fail", "store", s.cfg.Store.Name(), "err", err,
				"fail_open", s.cfg.FailOpen)
		} else {
			s.log.Debug("store error", "err", err, "key", key)
		}
		if s.cfg.FailOpen {
			e.counters.failOpen.Inc()
		}
		return verdict{allowed: s.cfg.FailOpen, degraded: true}, nil
	}
	if s.storeDown.Load() && s.storeDown.CompareAndSwap(true, false) {
		s.log.Info("store recovered", "store", s.cfg.Store.Name())
	}
	return s.tally(e, res, shadow), nil
}

// tally counts a decision the store (or a rule that needs no store) made and
// applies shadow mode to it.
func (s *Server) tally(e *policyEntry, res store.Result, shadow bool) verdict {
	v := verdict{res: res, allowed: res.Allowed}
	switch {
	case res.Allowed:
		s.allowed.Add(1)
		e.counters.allowed.Inc()
	case shadow:
		s.shadowDenied.Add(1)
		e.counters.shadowDenied.Inc()
		v.allowed, v.shadowDenied = true, true
	default:
		s.denied.Add(1)
		e.counters.denied.Inc()
	}
	return v
}

// answer writes the /allow response for a decision or decide's error.
func (s *Server) answer(w http.ResponseWriter, e *policyEntry, v verdict, err error) {
	switch {
	case errors.Is(err, store.ErrCostExceedsBurst): // cannot happen: callers check first
		s.fail(w, http.StatusBadRequest, "%v", err)
	case err != nil: // the client left; nobody to answer
	case v.degraded:
		s.writeDegraded(w, e)
	default:
		s.writeDecision(w, e, v.res, v.shadowDenied)
	}
}
