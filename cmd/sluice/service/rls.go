package service

import (
	"context"
	"math"
	"sync"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
	"github.com/sluice-go/sluice/internal/decide"
	"github.com/sluice-go/sluice/store"
)

// RegisterRateLimitService registers s on g as Envoy's
// envoy.service.ratelimit.v3.RateLimitService, the gRPC service Envoy's
// global rate-limit filter calls (ShouldRateLimit). Decisions go through the
// same store, metrics, shadow and fail modes as /allow.
//
// A request names a domain and a list of descriptors; each descriptor is
// matched against the rules (Config.Rules) and decided on its own, spending
// its cost from its rule's bucket even when another descriptor of the same
// request is over its limit (as envoyproxy/ratelimit does). The descriptors
// that reach the store go to it in one call when it takes several
// (store.Batch: on Redis one round trip, as envoyproxy/ratelimit's one
// pipeline per request), each answered as if decided alone. The response
// is OVER_LIMIT when any descriptor of a rule without quota_mode is, or when
// the request has descriptors of quota_mode rules and every one of them is
// (a quota_mode rule's own status still says OVER_LIMIT). Per descriptor:
//   - no matching rule: OK, nothing counted, no current_limit;
//   - a rule that another matched rule of the request replaces (by its
//     rate_limit.name): the same, its buckets untouched;
//   - an unlimited rule: OK, limit_remaining 2³²−1, no bucket (counted as
//     allowed in the metrics);
//   - requests_per_unit 0: OVER_LIMIT, counted as denied;
//   - otherwise the GCRA decision for cost hits_addend (the descriptor's own
//     when set, else the request's; 0 means 1): current_limit (with the
//     rule's name only when the file names it, as envoyproxy/ratelimit),
//     and limit_remaining (whole tokens left); duration_until_reset is, when
//     allowed, the time until the bucket is full again and, when over the
//     limit, the time until the same request would be allowed, in whole
//     seconds rounded up (Envoy reads only the seconds).
//
// A shadow_mode rule answers OK where it would deny (counted as
// shadow_denied); the global shadow mode (Config.Shadow) leaves each
// descriptor's status as decided and answers the request as a whole OK. When
// the store fails, a descriptor is OK under fail-open, OVER_LIMIT (retry in
// 1 s) under fail-closed. A descriptor's limit override (the "limit" field
// Envoy fills from its route config) replaces the rule, as in
// envoyproxy/ratelimit, in a domain the rules configure (elsewhere the
// descriptor has no limit, override or not, as there), and is never in
// shadow mode; its unit_multiplier stretches its unit; its buckets are
// apart from the rules' (see rules.BucketKey). At most Config.MaxOverrides
// distinct overrides get buckets; past that, a new one is answered as if
// the descriptor carried none (see DefaultMaxOverrides).
//
// An empty domain, no descriptors, a descriptor without entries, a
// per-descriptor hits_addend of 0 (check without spending: not supported)
// and, in a configured domain, an override with an unknown unit or YEAR, a
// unit_multiplier of 0, a period (unit × unit_multiplier, checked before it
// is multiplied) past 52 days (rules.MaxPeriod) or a rate above 10⁹ a
// second are refused with InvalidArgument.
func (s *Server) RegisterRateLimitService(g grpc.ServiceRegistrar) {
	rlsv3.RegisterRateLimitServiceServer(g, &rateLimitService{s: s})
}

type rateLimitService struct {
	rlsv3.UnimplementedRateLimitServiceServer
	s *Server
}

var unlimitedStatus = &rlsv3.RateLimitResponse_DescriptorStatus{
	Code: rlsv3.RateLimitResponse_OK, LimitRemaining: math.MaxUint32,
}

// ShouldRateLimit implements rlsv3.RateLimitServiceServer.
func (g *rateLimitService) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	s := g.s
	if s.clients != nil {
		if err := s.allowGRPC(ctx); err != nil {
			return nil, err
		}
	}
	domain, descs := req.GetDomain(), req.GetDescriptors()
	if domain == "" {
		return nil, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	}
	if len(descs) == 0 {
		return nil, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	}
	rs := s.rules.Load()
	var cfg *rules.Config
	if rs != nil {
		cfg = rs.cfg
	}
	resp, boxes := newResponse(len(descs))
	// As envoyproxy/ratelimit: a limit override counts only in a domain
	// the rules configure; elsewhere the descriptor has no limit at all.
	known := cfg.HasDomain(domain)
	// Check every descriptor before deciding any, so that a request refused
	// for its last descriptor has spent nothing for its first.
	for i, d := range descs {
		if err := g.check(i, d, known); err != nil {
			return nil, err
		}
	}
	// Why a fixed array: Envoy sends a handful of descriptors; up to 8
	// stay on the stack, keeping the request path free of this allocation.
	var buf [8]*ruleEntry
	matched := buf[:0]
	if len(descs) > len(buf) {
		matched = make([]*ruleEntry, 0, len(descs))
	}
	for _, d := range descs {
		var e *ruleEntry
		if o := d.GetLimit(); o != nil && known {
			e = g.override(overrideOf(o))
		}
		if e == nil { // no override, or one past -max-overrides
			if r := rules.Match(cfg, domain, d.GetEntries()); r != nil {
				e = &rs.entries[r.Index]
			}
		}
		matched = append(matched, e)
	}
	if rs != nil && rs.replaces {
		dropReplaced(matched)
	}
	// As envoyproxy/ratelimit: the request is over the limit when any
	// descriptor of a rule without quota_mode is, or when it has
	// quota_mode descriptors and every one of them is.
	switch {
	case len(descs) == 1:
	case s.cfg.StopOverLimitIncrement:
		if err := g.decideAll(ctx, req, matched, resp.Statuses, boxes); err != nil {
			return nil, status.FromContextError(err).Err()
		}
	case s.gate.Batches():
		if err := g.decideEach(ctx, req, matched, resp.Statuses, boxes); err != nil {
			return nil, status.FromContextError(err).Err()
		}
	}
	var over, quota, quotaOver int
	for i, d := range descs {
		e := matched[i]
		st := resp.Statuses[i]
		if st == nil {
			var err error
			if st, err = g.decide(ctx, domain, d.GetEntries(), costOf(req, d), e, &boxes[i]); err != nil {
				return nil, status.FromContextError(err).Err()
			}
			resp.Statuses[i] = st
		}
		isQuota := e != nil && e.rule.QuotaMode && !e.rule.Unlimited
		if isQuota {
			quota++
		}
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			if isQuota {
				quotaOver++
			} else {
				over++
			}
		}
	}
	if over > 0 || (quota > 0 && quotaOver == quota) {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if s.cfg.Shadow {
		resp.OverallCode = rlsv3.RateLimitResponse_OK
	}
	return resp, nil
}

// statusBox holds a descriptor's status and the duration it points to, so
// that both take one allocation (see newResponse).
type statusBox struct {
	st  rlsv3.RateLimitResponse_DescriptorStatus
	dur durationpb.Duration
}

// oneResponse is a response to one descriptor (what Envoy sends most) with
// its status: one allocation where separate ones take four.
type oneResponse struct {
	resp     rlsv3.RateLimitResponse
	statuses [1]*rlsv3.RateLimitResponse_DescriptorStatus
	box      [1]statusBox
}

// newResponse is an OK response with n status slots (nil until filled),
// and n boxes for those statuses. Why boxes: each allocation costs on the
// request path, and grpc-go's own per-call allocations already outnumber
// /allow's; the boxes are never reused (grpc-go may hold the response
// until it is encoded), only allocated together.
func newResponse(n int) (*rlsv3.RateLimitResponse, []statusBox) {
	if n == 1 {
		o := &oneResponse{}
		o.resp.OverallCode = rlsv3.RateLimitResponse_OK
		o.resp.Statuses = o.statuses[:]
		return &o.resp, o.box[:]
	}
	return &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, n),
	}, make([]statusBox, n)
}

// costOf is descriptor d's cost: its own hits_addend when set, else the
// request's (0 means 1).
func costOf(req *rlsv3.RateLimitRequest, d *ratelimitv3.RateLimitDescriptor) uint64 {
	if h := d.GetHitsAddend(); h != nil {
		return h.GetValue()
	}
	return uint64(max(1, req.GetHitsAddend()))
}

// decideAll answers a request's descriptors as one, for
// Config.StopOverLimitIncrement: when any descriptor is over its limit,
// nothing is spent on the others (store.AllOrNothing), which answer OK with
// what their buckets hold. A descriptor over without asking the store
// (requests_per_unit 0, a cost above the rule's whole allowance) counts
// too. It fills statuses (in boxes, one per descriptor); on an error no
// answer is due.
func (g *rateLimitService) decideAll(ctx context.Context, req *rlsv3.RateLimitRequest, matched []*ruleEntry, statuses []*rlsv3.RateLimitResponse_DescriptorStatus, boxes []statusBox) error {
	s := g.s
	domain, descs := req.GetDomain(), req.GetDescriptors()
	var reqs []store.Request
	var at []int // reqs[j] is descriptor at[j]
	spend := true
	for i, d := range descs {
		e, cost := matched[i], costOf(req, d)
		switch {
		case e == nil, e.rule.Unlimited: // answered by decide, without the store
			continue
		case !e.limited || cost > uint64(e.p.Burst):
			spend = false // over whatever the store says: the others only look
			continue
		}
		r := e.rule
		if r.Override {
			o := *r
			o.Domain = domain
			r = &o
		}
		reqs = append(reqs, store.Request{Key: rules.BucketKey(rules.RLS, r, d.GetEntries()), Cost: int64(cost), Policy: e.p})
		at = append(at, i)
	}
	if len(reqs) == 0 {
		return nil
	}
	out := make([]store.Result, len(reqs))
	var dec decide.Decision
	s.gate.DecideAll(ctx, reqs, spend, out, &dec)
	s.storeLat.Observe(float64(dec.Latency) / 1e9)
	for j, i := range at {
		e := matched[i]
		v, done, err := s.failure(ctx, &dec, reqs[j].Key, &e.policyEntry)
		if err != nil {
			return err
		}
		if !done {
			if !out[j].Allowed {
				e.ui.deny(reqs[j].Key)
			}
			v = s.tally(&e.policyEntry, out[j], s.cfg.Shadow || e.rule.Shadow)
		}
		statuses[i] = statusOf(e, v, true, &boxes[i])
	}
	return nil
}

// eachScratch is decideEach's working space, pooled: the slices a store
// call takes escape (an interface call), and a request's descriptors are a
// handful, so a pooled one keeps the request path free of allocations.
type eachScratch struct {
	reqs [8]store.Request
	at   [8]int // reqs[j] is descriptor at[j]
	d    [8]decide.Decision
	res  [8]store.Result
	errs [8]error
}

var eachPool = sync.Pool{New: func() any { return new(eachScratch) }}

// decideEach decides, in one store call (decide.Gate.DecideEach), the
// descriptors of a request that reach the store, when there are several:
// each spends or not on its own, with the answer decide would give it
// (statuses, metrics, shadow, failure handling), but the request waits for
// one round trip to Redis rather than one per descriptor. The others (no
// rule, unlimited, over without asking) it leaves to decide. It fills
// statuses (in boxes); on an error no answer is due.
func (g *rateLimitService) decideEach(ctx context.Context, req *rlsv3.RateLimitRequest, matched []*ruleEntry, statuses []*rlsv3.RateLimitResponse_DescriptorStatus, boxes []statusBox) error {
	s := g.s
	domain, descs := req.GetDomain(), req.GetDescriptors()
	n := 0
	for i, d := range descs {
		if e := matched[i]; e != nil && !e.rule.Unlimited && e.limited && costOf(req, d) <= uint64(e.p.Burst) {
			n++
		}
	}
	if n < 2 {
		return nil // one store call either way: decide's path
	}
	sc := eachPool.Get().(*eachScratch)
	defer func() {
		clear(sc.reqs[:])
		clear(sc.d[:])
		clear(sc.errs[:])
		eachPool.Put(sc)
	}()
	reqs, at := sc.reqs[:0], sc.at[:0]
	d, res, errs := sc.d[:], sc.res[:], sc.errs[:]
	if n > len(sc.reqs) {
		reqs, at = make([]store.Request, 0, n), make([]int, 0, n)
		d, res, errs = make([]decide.Decision, n), make([]store.Result, n), make([]error, n)
	}
	for i, desc := range descs {
		e, cost := matched[i], costOf(req, desc)
		if e == nil || e.rule.Unlimited || !e.limited || cost > uint64(e.p.Burst) {
			continue
		}
		r := e.rule
		if r.Override { // one entry serves every domain: name this one
			o := *r
			o.Domain = domain
			r = &o
		}
		reqs = append(reqs, store.Request{Key: rules.BucketKey(rules.RLS, r, desc.GetEntries()), Cost: int64(cost), Policy: e.p})
		at = append(at, i)
	}
	s.gate.DecideEach(ctx, reqs, d, res, errs)
	// As decide for each, in the descriptors' order: a caller gone at one
	// descriptor leaves the later ones uncounted, as one after another.
	for j, i := range at {
		e := matched[i]
		s.storeLat.Observe(float64(d[j].Latency) / 1e9)
		v, done, err := s.failure(ctx, &d[j], reqs[j].Key, &e.policyEntry)
		if err != nil {
			return err
		}
		if !done {
			if !d[j].Result.Allowed {
				e.ui.deny(reqs[j].Key)
			}
			v = s.tally(&e.policyEntry, d[j].Result, s.cfg.Shadow || e.rule.Shadow)
		}
		statuses[i] = statusOf(e, v, true, &boxes[i])
	}
	return nil
}

// dropReplaced removes from matched every named rule that another matched
// rule replaces (rate_limit.replaces), as envoyproxy/ratelimit does: its
// descriptor is answered as matching nothing, and its buckets are not
// touched. A rule replaces others whether it is limited or unlimited; a
// limit override replaces nothing and is never replaced.
func dropReplaced(matched []*ruleEntry) {
	var replaced map[string]bool
	for _, e := range matched {
		if e == nil {
			continue
		}
		for _, name := range e.rule.Replaces {
			if replaced == nil {
				replaced = map[string]bool{}
			}
			replaced[name] = true
		}
	}
	if replaced == nil {
		return
	}
	for i, e := range matched {
		if e != nil && e.rule.Named && replaced[e.rule.Name] {
			matched[i] = nil
		}
	}
}

// check refuses descriptor i of a request if it has no entries, a
// hits_addend of 0, or, in a domain the rules configure (known), a limit
// override that cannot be a policy.
func (g *rateLimitService) check(i int, d *ratelimitv3.RateLimitDescriptor, known bool) error {
	if len(d.GetEntries()) == 0 {
		return status.Errorf(codes.InvalidArgument, "descriptor %d has no entries", i)
	}
	if h := d.GetHitsAddend(); h != nil && h.GetValue() == 0 {
		return status.Errorf(codes.InvalidArgument, "descriptor %d: hits_addend 0 (check without spending) is not supported", i)
	}
	if o := d.GetLimit(); o != nil && known {
		if err := g.s.overrides.check(o); err != nil {
			return status.Errorf(codes.InvalidArgument, "descriptor %d: limit override: %v", i, err)
		}
	}
	return nil
}

// decide answers one descriptor of domain matched to e (nil: no rule); the
// status is box's, or shared.
func (g *rateLimitService) decide(ctx context.Context, domain string, entries []*ratelimitv3.RateLimitDescriptor_Entry, cost uint64, e *ruleEntry, box *statusBox) (*rlsv3.RateLimitResponse_DescriptorStatus, error) {
	s := g.s
	switch {
	case e == nil:
		box.st.Code = rlsv3.RateLimitResponse_OK
		return &box.st, nil
	case e.rule.Unlimited:
		s.tally(&e.policyEntry, store.Result{Allowed: true}, false) // counted, no bucket
		return unlimitedStatus, nil
	}
	shadow := s.cfg.Shadow || e.rule.Shadow
	var v verdict
	asked := e.limited && cost <= uint64(e.p.Burst)
	if asked {
		var err error
		r := e.rule
		if r.Override { // one entry serves every domain: name this one
			o := *r
			o.Domain = domain
			r = &o
		}
		v, err = s.decide(ctx, rules.BucketKey(rules.RLS, r, entries), int64(cost), &e.policyEntry, shadow)
		if err != nil {
			return nil, err
		}
	} else {
		// requests_per_unit 0, or a cost that can never be allowed: over
		// the limit without asking the store, and no time would change it
		// (so no duration_until_reset).
		v = s.tally(&e.policyEntry, store.Result{}, shadow)
	}
	return statusOf(e, v, asked, box), nil
}

// statusOf is the status of a descriptor matched to a limited rule e with
// verdict v (asked: the store decided it), written in box (a zero one).
func statusOf(e *ruleEntry, v verdict, asked bool, box *statusBox) *rlsv3.RateLimitResponse_DescriptorStatus {
	st := &box.st
	st.CurrentLimit = e.limit
	// Only a shadow_mode rule turns its own status OK; the global shadow
	// mode answers OK for the request as a whole (ShouldRateLimit).
	st.Code = rlsv3.RateLimitResponse_OK
	if !v.allowed || (v.shadowDenied && !e.rule.Shadow) {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	switch {
	case v.degraded:
		if !v.allowed {
			box.dur.Seconds = 1
			st.DurationUntilReset = &box.dur
		}
	case asked:
		st.LimitRemaining = uint32(min(math.Floor(max(v.res.Remaining, 0)), math.MaxUint32))
		d := v.res.ResetAfter
		if !v.res.Allowed {
			d = v.res.RetryAfter
		}
		// Why only the seconds: wholeSecondsUp is inlined here and its
		// Duration stays on the stack; the box's is the one sent.
		box.dur.Seconds = wholeSecondsUp(d).Seconds
		st.DurationUntilReset = &box.dur
	}
	return st
}

// wholeSecondsUp is d in whole seconds, rounded up, so never less than the
// true wait. Why: Envoy fills X-RateLimit-Reset from the duration's seconds
// alone, so 20 ms sent as such tells the client 0 and it retries at once;
// envoyproxy/ratelimit's fixed windows always send whole seconds.
func wholeSecondsUp(d time.Duration) *durationpb.Duration {
	s := int64(d / time.Second)
	if d%time.Second > 0 {
		s++
	}
	return &durationpb.Duration{Seconds: s}
}
