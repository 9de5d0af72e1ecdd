package service

import (
	"context"
	"errors"
	"net/http"

	"github.com/sluice-go/sluice/internal/decide"
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
	degraded     bool // the store failed; allowed follows Config.Fail
}

// decide is the one decision path of both APIs: it asks the store whether
// key may spend cost tokens under e through s.gate (bounded by StoreTimeout,
// following the fail mode), records the store latency, counts the outcome in
// e's metrics and the totals, and applies shadow mode. The error is non-nil
// only when no answer is due: the caller's ctx ended (the client left), or
// cost exceeds the burst (store.ErrCostExceedsBurst, which callers check
// first).
func (s *Server) decide(ctx context.Context, key string, cost int64, e *policyEntry, shadow bool) (verdict, error) {
	var d decide.Decision
	s.gate.Allow(ctx, key, cost, e.p, &d)
	s.storeLat.Observe(float64(d.Latency) / 1e9)
	if v, done, err := s.failure(ctx, &d, key, e); done {
		return v, err
	}
	if !d.Result.Allowed {
		e.ui.deny(key) // the denial path: the page's top keys
	}
	return s.tally(e, d.Result, shadow), nil
}

// failure handles the outcomes of a gate call that carry no decision (the
// caller gone, the request refused, the store failed) and reports whether
// it did. An outage's start and end are the gate's to log and report (to
// uiOutage), once each.
func (s *Server) failure(ctx context.Context, d *decide.Decision, key string, e *policyEntry) (v verdict, done bool, err error) {
	switch d.Outcome {
	case decide.Gone:
		// The client went away mid-call: not the store's fault, and
		// nobody is left to answer; count it so it is not lost.
		s.canceled.Add(1)
		e.counters().canceled.Inc()
		return verdict{}, true, ctx.Err()
	case decide.Refused:
		return verdict{}, true, d.Err
	case decide.Degraded:
		s.storeErr.Inc()
		s.degraded.Add(1)
		e.counters().storeError.Inc()
		e.ui.count(uiDegraded)
		if d.Change != decide.Failing {
			s.log.Debug("store error", "err", d.Err, "key", key)
		}
		if d.Allowed {
			e.counters().failOpen.Inc()
		}
		return verdict{allowed: d.Allowed, degraded: true}, true, nil
	}
	return verdict{}, false, nil
}

// tally counts a decision the store (or a rule that needs no store) made and
// applies shadow mode to it.
func (s *Server) tally(e *policyEntry, res store.Result, shadow bool) verdict {
	v := verdict{res: res, allowed: res.Allowed}
	switch {
	case res.Allowed:
		s.allowed.Add(1)
		e.counters().allowed.Inc()
		e.ui.count(uiAllowed)
	case shadow:
		s.shadowDenied.Add(1)
		e.counters().shadowDenied.Inc()
		e.ui.count(uiShadowDenied)
		v.allowed, v.shadowDenied = true, true
	default:
		s.denied.Add(1)
		e.counters().denied.Inc()
		e.ui.count(uiDenied)
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
