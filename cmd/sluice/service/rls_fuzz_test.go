package service_test

import (
	"context"
	"io"
	"log/slog"
	"math"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
	"github.com/sluice-go/sluice/store"
)

// invalidRequest is the documented refusal rule of ShouldRateLimit under
// rules c: an empty domain, no descriptors, a descriptor without entries or
// with hits_addend 0, or, in a domain c configures, a limit override that
// is not a policy (a unit other than second to month, a unit_multiplier of
// 0, more than 1e9 a second, a period past 52 days).
func invalidRequest(c *rules.Config, req *rlsv3.RateLimitRequest) bool {
	if req.GetDomain() == "" || len(req.GetDescriptors()) == 0 {
		return true
	}
	for _, d := range req.GetDescriptors() {
		if len(d.GetEntries()) == 0 || d.GetHitsAddend() != nil && d.GetHitsAddend().GetValue() == 0 {
			return true
		}
		if o := d.GetLimit(); o != nil && c.HasDomain(req.GetDomain()) {
			u := rules.Unit(strings.ToLower(o.GetUnit().String()))
			if u == rules.Year || u.Duration() == 0 || o.GetUnitMultiplier() != nil && o.GetUnitMultiplier().GetValue() == 0 {
				return true
			}
			if _, err := rules.PeriodOf(u, o.GetUnitMultiplier().GetValue()); err != nil {
				return true
			}
			r := &rules.Rule{RequestsPerUnit: o.GetRequestsPerUnit(), Unit: u, UnitMultiplier: o.GetUnitMultiplier().GetValue()}
			if p, ok := r.Policy(); ok && p.Validate() != nil {
				return true
			}
		}
	}
	return false
}

// FuzzShouldRateLimit feeds any request Envoy's protobuf can carry to the
// gRPC check: it never panics; it refuses exactly the invalid requests, with
// InvalidArgument; and it answers the others with one status per
// descriptor, over the limit as a whole exactly when one is, each under its
// override's limit or its rule's (none when neither applies).
func FuzzShouldRateLimit(f *testing.F) {
	over := func(d *ratelimitv3.RateLimitDescriptor, rpu uint32, u typev3.RateLimitUnit) *ratelimitv3.RateLimitDescriptor {
		d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: u}
		return d
	}
	hits := desc("client_ip", "1")
	hits.HitsAddend = wrapperspb.UInt64(7)
	zero := desc("client_ip", "1")
	zero.HitsAddend = wrapperspb.UInt64(0)
	for _, r := range []*rlsv3.RateLimitRequest{
		{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("client_ip", "198.51.100.7")}},
		{Domain: "sms", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("kind", "promo", "phone", "555"), desc("phone", "555")}, HitsAddend: 2},
		{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{hits, zero}},
		{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{over(desc("a", "b"), 3, typev3.RateLimitUnit_MINUTE)}},
		{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{over(desc("a", "b"), 2e9, typev3.RateLimitUnit_SECOND)}},
		{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{over(desc("a", "b"), 1, typev3.RateLimitUnit_YEAR)}},
		{Domain: "x", Descriptors: []*ratelimitv3.RateLimitDescriptor{over(desc("a", "b"), 1, typev3.RateLimitUnit_YEAR)}},
		{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("backup", "1"), desc("client_ip", "192.0.2.66"), {}}},
		{Domain: "http", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("key", "tenant-a")}},
		{},
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	mem := store.NewMemory()
	f.Cleanup(func() { _ = mem.Close() })
	c, err := rules.Parse("r.yaml", []byte(rlsRules))
	if err != nil {
		f.Fatal(err)
	}
	srv, err := service.New(service.Config{Store: mem, Default: store.Policy{Rate: 1, Burst: 1}, Rules: c, MaxOverrides: 4,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		f.Fatal(err)
	}
	rls := rlsDirect(srv)
	f.Fuzz(func(t *testing.T, data []byte) {
		var req rlsv3.RateLimitRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		resp, err := rls.ShouldRateLimit(context.Background(), &req)
		if invalidRequest(c, &req) {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("invalid request %v: got %v, %v", &req, resp, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("valid request %v: %v", &req, err)
		}
		if len(resp.GetStatuses()) != len(req.GetDescriptors()) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.GetStatuses()), len(req.GetDescriptors()))
		}
		anyOver := false
		for i, st := range resp.GetStatuses() {
			d := req.GetDescriptors()[i]
			switch st.GetCode() {
			case OVER:
				anyOver = true
			case OK:
			default:
				t.Fatalf("descriptor %d: code %v", i, st.GetCode())
			}
			rule := rules.Match(c, req.GetDomain(), d.GetEntries())
			o := d.GetLimit()
			if !c.HasDomain(req.GetDomain()) {
				o = nil // an override outside the rules' domains is no limit
			}
			cl := st.GetCurrentLimit()
			switch {
			case cl != nil:
				if (o == nil || o.GetRequestsPerUnit() != cl.GetRequestsPerUnit()) &&
					(rule == nil || rule.Unlimited || rule.RequestsPerUnit != cl.GetRequestsPerUnit()) {
					t.Fatalf("descriptor %d: current_limit %v: neither the override %v nor the rule %v", i, cl, o, rule)
				}
			case rule != nil && !rule.Unlimited:
				t.Fatalf("descriptor %d: no current_limit under rule %v", i, rule)
			case rule != nil && st.GetLimitRemaining() != math.MaxUint32:
				t.Fatalf("descriptor %d: unlimited rule answered %v", i, st)
			case rule == nil && o == nil && st.GetCode() != OK:
				t.Fatalf("descriptor %d: no rule, no override, answered %v", i, st)
			}
		}
		if want := map[bool]rlsv3.RateLimitResponse_Code{true: OVER, false: OK}[anyOver]; resp.GetOverallCode() != want {
			t.Fatalf("overall %v with statuses %v", resp.GetOverallCode(), resp.GetStatuses())
		}
	})
}
