package service_test

import (
	"context"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-go/sluice/cmd/sluice/redisstore"
	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/store"
)

const (
	OK   = rlsv3.RateLimitResponse_OK
	OVER = rlsv3.RateLimitResponse_OVER_LIMIT
)

// rlsRules is a rules file in the shape of envoyproxy/ratelimit's README
// examples (our own words), with an HTTP domain for /allow.
const rlsRules = `
domain: sms
descriptors:
  - key: kind
    value: promo
    descriptors:
      - key: phone
        rate_limit: {unit: day, requests_per_unit: 3}
  - key: phone
    rate_limit: {unit: day, requests_per_unit: 40}
---
domain: edge
descriptors:
  - key: client_ip
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: client_ip
    value: 192.0.2.66
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: backup
    rate_limit: {unlimited: true}
  - key: tenant
    descriptors:
      - key: plan
        value: free
        shadow_mode: true
        rate_limit: {unit: second, requests_per_unit: 5}
---
domain: http
descriptors:
  - key: key
    value: tenant-a
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: key
    value: internal
    rate_limit: {unlimited: true}
  - key: key
    value: über
    rate_limit: {unit: second, requests_per_unit: 2}
`

type rlsFixture struct {
	*fixture
	rls  rlsv3.RateLimitServiceClient
	file string
}

// newRLS serves a Server with rules over real loopback gRPC (the generated
// client and server) and HTTP, on a memory store with a hand-driven clock.
func newRLS(t *testing.T, yaml string, mutate func(*service.Config)) *rlsFixture {
	t.Helper()
	file := filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(file, []byte(yaml), 0o600))
	c, err := rules.Load(file)
	require.NoError(t, err)
	f := newFixture(t, func(cfg *service.Config) {
		cfg.Rules = c
		if mutate != nil {
			mutate(cfg)
		}
	})
	return &rlsFixture{fixture: f, rls: serveGRPC(t, f.srv), file: file}
}

func serveGRPC(t *testing.T, srv *service.Server) rlsv3.RateLimitServiceClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	srv.RegisterRateLimitService(g)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(); g.Stop(); <-done })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func (f *rlsFixture) ask(t *testing.T, domain string, hits uint32, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	r, err := f.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits})
	require.NoError(t, err)
	require.Len(t, r.Statuses, len(ds))
	return r
}

func codesOf(r *rlsv3.RateLimitResponse) []rlsv3.RateLimitResponse_Code {
	out := []rlsv3.RateLimitResponse_Code{r.OverallCode}
	for _, s := range r.Statuses {
		out = append(out, s.Code)
	}
	return out
}

// Two descriptors in one request, each decided on its own bucket: the nested
// promo rule (3 a day) runs out while the per-phone rule (40 a day) goes on.
func TestRLSOverAndUnderPerDescriptor(t *testing.T) {
	f := newRLS(t, rlsRules, nil)
	promo, phone := desc("kind", "promo", "phone", "555"), desc("phone", "555")
	const T = 8 * time.Hour // a day / 3
	for i := 1; i <= 3; i++ {
		r := f.ask(t, "sms", 0, promo, phone)
		require.Equal(t, []rlsv3.RateLimitResponse_Code{OK, OK, OK}, codesOf(r), "request %d", i)
		assert.EqualValues(t, 3-i, r.Statuses[0].LimitRemaining)
		assert.EqualValues(t, 40-i, r.Statuses[1].LimitRemaining)
		assert.Equal(t, time.Duration(i)*T, r.Statuses[0].DurationUntilReset.AsDuration(), "allowed: time until full")
	}
	r := f.ask(t, "sms", 0, promo, phone)
	assert.Equal(t, []rlsv3.RateLimitResponse_Code{OVER, OVER, OK}, codesOf(r))
	assert.Empty(t, r.Statuses[0].CurrentLimit.Name, "an unnamed rule sends no name, as envoyproxy/ratelimit")
	assert.EqualValues(t, 3, r.Statuses[0].CurrentLimit.RequestsPerUnit)
	assert.Equal(t, rlsv3.RateLimitResponse_RateLimit_DAY, r.Statuses[0].CurrentLimit.Unit)
	assert.EqualValues(t, 0, r.Statuses[0].LimitRemaining)
	assert.Equal(t, T, r.Statuses[0].DurationUntilReset.AsDuration(), "over: time until this request would pass")
	assert.EqualValues(t, 36, r.Statuses[1].LimitRemaining, "the phone rule spent on the 4th request too")

	// Another phone number is another bucket of the same key-only rule.
	r = f.ask(t, "sms", 0, desc("kind", "promo", "phone", "556"))
	assert.Equal(t, OK, r.OverallCode)
	assert.EqualValues(t, 2, r.Statuses[0].LimitRemaining)

	f.clock.Advance(T)
	r = f.ask(t, "sms", 0, promo)
	assert.Equal(t, OK, r.OverallCode, "one promo token back after a day/3")
	assert.Equal(t, OVER, f.ask(t, "sms", 0, promo).OverallCode)
}

func TestRLSUnmatchedCountsNothing(t *testing.T) {
	f := newRLS(t, rlsRules, nil)
	for _, tc := range []struct {
		domain string
		d      *ratelimitv3.RateLimitDescriptor
	}{
		{"nowhere", desc("phone", "555")},
		{"sms", desc("kind", "promo")},                         // a placeholder without rate_limit
		{"sms", desc("kind", "promo", "phone", "5", "x", "y")}, // deeper than any rule
		{"sms", desc("fax", "555")},
	} {
		for range 50 {
			r := f.ask(t, tc.domain, 0, tc.d)
			assert.Equal(t, OK, r.OverallCode)
			assert.Equal(t, OK, r.Statuses[0].Code)
			assert.Nil(t, r.Statuses[0].CurrentLimit)
		}
	}
	assert.Equal(t, service.Stats{}, f.srv.Stats())
	keys, err := f.mem.Keys(context.Background())
	require.NoError(t, err)
	assert.Zero(t, keys, "no bucket was touched")
}

func TestRLSUnlimitedAndBlocked(t *testing.T) {
	f := newRLS(t, rlsRules, nil)
	for range 100 {
		r := f.ask(t, "edge", 0, desc("backup", "nightly"))
		require.Equal(t, OK, r.OverallCode)
		assert.EqualValues(t, uint32(math.MaxUint32), r.Statuses[0].LimitRemaining)
		assert.Nil(t, r.Statuses[0].CurrentLimit)
	}
	// requests_per_unit 0 blocks that address; others get 10 a second.
	r := f.ask(t, "edge", 0, desc("client_ip", "192.0.2.66"), desc("client_ip", "198.51.100.7"))
	assert.Equal(t, []rlsv3.RateLimitResponse_Code{OVER, OVER, OK}, codesOf(r))
	assert.EqualValues(t, 0, r.Statuses[0].CurrentLimit.RequestsPerUnit)
	assert.EqualValues(t, 9, r.Statuses[1].LimitRemaining)
	keys, err := f.mem.Keys(context.Background())
	require.NoError(t, err)
	assert.EqualValues(t, 1, keys, "only the limited address has a bucket")
	assert.Equal(t, service.Stats{Allowed: 101, Denied: 1}, f.srv.Stats(), "unlimited counts as allowed; the blocked address as denied")
}

// A shadow_mode rule decides and counts but answers OK.
func TestRLSShadowRule(t *testing.T) {
	f := newRLS(t, rlsRules, nil)
	free := desc("tenant", "t1", "plan", "free")
	for i := 1; i <= 8; i++ {
		r := f.ask(t, "edge", 0, free)
		require.Equal(t, []rlsv3.RateLimitResponse_Code{OK, OK}, codesOf(r), "request %d", i)
	}
	assert.Equal(t, service.Stats{Allowed: 5, ShadowDenied: 3}, f.srv.Stats())
	assert.Contains(t, f.get(t, "/metrics").raw, `sluice_decisions_total{policy="edge.tenant.plan_free",result="shadow_denied"} 3`)
}

// The global shadow mode (-shadow) keeps each descriptor's verdict visible
// and answers the request OK, as envoyproxy/ratelimit's SHADOW_MODE does.
func TestRLSGlobalShadow(t *testing.T) {
	f := newRLS(t, rlsRules, func(c *service.Config) { c.Shadow = true })
	for range 3 {
		f.ask(t, "sms", 0, desc("kind", "promo", "phone", "1"))
	}
	r := f.ask(t, "sms", 0, desc("kind", "promo", "phone", "1"))
	assert.Equal(t, []rlsv3.RateLimitResponse_Code{OK, OVER}, codesOf(r))
	assert.Equal(t, service.Stats{Allowed: 3, ShadowDenied: 1}, f.srv.Stats())
}

func TestRLSHitsAddend(t *testing.T) {
	f := newRLS(t, rlsRules, nil)
	ip := desc("client_ip", "198.51.100.1")
	r := f.ask(t, "edge", 3, ip)
	assert.EqualValues(t, 7, r.Statuses[0].LimitRemaining, "hits_addend 3")
	r = f.ask(t, "edge", 0, ip)
	assert.EqualValues(t, 6, r.Statuses[0].LimitRemaining, "hits_addend 0 means 1")

	// A descriptor's own hits_addend wins over the request's.
	own := desc("client_ip", "198.51.100.1")
	own.HitsAddend = wrapperspb.UInt64(5)
	r = f.ask(t, "edge", 2, own, desc("client_ip", "198.51.100.2"))
	assert.EqualValues(t, 1, r.Statuses[0].LimitRemaining)
	assert.EqualValues(t, 8, r.Statuses[1].LimitRemaining)

	// More than the whole burst can never pass; it spends nothing.
	r = f.ask(t, "edge", 11, desc("client_ip", "198.51.100.3"))
	assert.Equal(t, OVER, r.OverallCode)
	assert.Nil(t, r.Statuses[0].DurationUntilReset, "no wait makes 11 of 10 pass")
	r = f.ask(t, "edge", 10, desc("client_ip", "198.51.100.3"))
	assert.Equal(t, OK, r.OverallCode)
	assert.EqualValues(t, 0, r.Statuses[0].LimitRemaining)
	r = f.ask(t, "edge", 1, own) // own asks for 5; 1 token left
	assert.Equal(t, OVER, r.OverallCode)
	assert.Equal(t, time.Second, r.Statuses[0].DurationUntilReset.AsDuration(), "4 more tokens at 10/s: 400 ms, rounded up to whole seconds")
}

// duration_until_reset is whole seconds, rounded up, never less than the
// true wait: Envoy fills X-RateLimit-Reset from the seconds alone, so 20 ms
// sent as such would tell a client 0 and it would retry at once.
func TestRLSDurationUntilResetWholeSecondsRoundedUp(t *testing.T) {
	f := newRLS(t, rlsRules, nil)
	ip := desc("client_ip", "198.51.100.40") // edge: 10 per second, burst 10
	for i := 1; i <= 10; i++ {
		r := f.ask(t, "edge", 0, ip)
		require.Equal(t, OK, r.OverallCode)
		d := r.Statuses[0].DurationUntilReset
		require.NotNil(t, d)
		assert.Zero(t, d.Nanos, "allowed %d: whole seconds", i)
		assert.EqualValues(t, 1, d.Seconds, "allowed %d: %d00 ms to full, rounded up", i, i)
	}
	r := f.ask(t, "edge", 0, ip)
	require.Equal(t, OVER, r.OverallCode)
	d := r.Statuses[0].DurationUntilReset
	assert.Zero(t, d.Nanos, "over: whole seconds")
	assert.EqualValues(t, 1, d.Seconds, "over: 100 ms to wait, rounded up to 1 s, never 0")

	f.clock.Advance(100 * time.Millisecond)
	for range 2 { // one token came back: spend it, then over again
		f.ask(t, "edge", 0, ip)
	}
	r = f.ask(t, "edge", 0, ip)
	require.Equal(t, OVER, r.OverallCode)
	assert.Equal(t, time.Second, r.Statuses[0].DurationUntilReset.AsDuration())

	for _, c := range []struct {
		in   time.Duration
		want int64 // seconds
	}{
		{0, 0}, {1, 1}, {20 * time.Millisecond, 1}, {time.Second, 1}, {time.Second + 1, 2},
		{5*time.Minute + 59990*time.Millisecond, 360}, {math.MaxInt64, math.MaxInt64/int64(time.Second) + 1},
	} {
		got := service.WholeSecondsUp(c.in)
		assert.Zero(t, got.Nanos, "wholeSecondsUp(%v)", c.in)
		assert.Equal(t, c.want, got.Seconds, "wholeSecondsUp(%v)", c.in)
	}
}

// A limit override applies in a domain the rules configure, to any
// descriptor; in any other domain the descriptor has no limit at all, as
// envoyproxy/ratelimit answers (even an override it could not keep).
func TestRLSLimitOverride(t *testing.T) {
	f := newRLS(t, rlsRules, nil)
	d := desc("anything", "x")
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_MINUTE}
	assert.Equal(t, OK, f.ask(t, "edge", 0, d).OverallCode)
	assert.Equal(t, OK, f.ask(t, "edge", 0, d).OverallCode)
	r := f.ask(t, "edge", 0, d)
	assert.Equal(t, OVER, r.OverallCode)
	assert.EqualValues(t, 2, r.Statuses[0].CurrentLimit.RequestsPerUnit)
	assert.Equal(t, rlsv3.RateLimitResponse_RateLimit_MINUTE, r.Statuses[0].CurrentLimit.Unit)
	assert.Nil(t, r.Statuses[0].CurrentLimit.UnitMultiplier)

	year := desc("anything", "x")
	year.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_YEAR}
	for range 3 {
		r = f.ask(t, "nowhere", 0, d, year)
		assert.Equal(t, OK, r.OverallCode)
		assert.Nil(t, r.Statuses[0].CurrentLimit, "no limit in an unconfigured domain")
		assert.Nil(t, r.Statuses[1].CurrentLimit)
	}
	assert.Contains(t, f.get(t, "/metrics").raw, "sluice_override_policies 1\n", "only edge's override has buckets")

	// unit_multiplier stretches the period: 2 per 5 minutes.
	five := desc("anything", "y")
	five.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_MINUTE, UnitMultiplier: wrapperspb.UInt32(5)}
	r = f.ask(t, "edge", 0, five)
	assert.Equal(t, OK, r.OverallCode)
	assert.EqualValues(t, 5, r.Statuses[0].CurrentLimit.GetUnitMultiplier().GetValue())
	assert.Equal(t, 5*time.Minute/2, r.Statuses[0].DurationUntilReset.AsDuration(), "one token back in 2.5 minutes")
	f.ask(t, "edge", 0, five)
	r = f.ask(t, "edge", 0, five)
	assert.Equal(t, OVER, r.OverallCode)
	assert.Equal(t, 5*time.Minute/2, r.Statuses[0].DurationUntilReset.AsDuration())
}

func TestRLSInvalidRequests(t *testing.T) {
	f := newRLS(t, rlsRules, nil)
	zero := desc("client_ip", "1")
	zero.HitsAddend = wrapperspb.UInt64(0)
	badUnit := desc("a", "b")
	badUnit.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_YEAR}
	tooFast := desc("a", "b")
	tooFast.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2e9, Unit: typev3.RateLimitUnit_SECOND}
	multiplier := desc("a", "b")
	multiplier.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_SECOND, UnitMultiplier: wrapperspb.UInt32(0)}
	longPeriod := desc("a", "b")
	longPeriod.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_DAY, UnitMultiplier: wrapperspb.UInt32(60)}
	for name, req := range map[string]*rlsv3.RateLimitRequest{
		"override 2e9/s": {Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{tooFast}},
		"multiplier 0":   {Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{multiplier}},
		"60 days":        {Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{longPeriod}},
		"empty domain":   {Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "b")}},
		"no descriptors": {Domain: "edge"},
		"no entries":     {Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{}}},
		"hits_addend 0":  {Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{zero}},
		"override year":  {Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{badUnit}},
	} {
		_, err := f.rls.ShouldRateLimit(context.Background(), req)
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "%s: %v", name, err)
	}
	// A request refused for a later descriptor spends nothing for an
	// earlier one.
	_, err := f.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("client_ip", "198.51.100.4"), zero}})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	assert.EqualValues(t, 9, f.ask(t, "edge", 0, desc("client_ip", "198.51.100.4")).Statuses[0].LimitRemaining)
}

// /allow?key=K is the descriptor [("key", K)] in the HTTP domain, under that
// domain's rules, but in a bucket of its own: a gRPC request for the same
// domain and descriptor spends from another. Keys without a rule keep
// -rate/-burst.
func TestRLSHTTPRulesOwnBuckets(t *testing.T) {
	f := newRLS(t, rlsRules, nil)
	for range 3 {
		require.Equal(t, 200, f.get(t, "/allow?key=tenant-a").status)
	}
	r := f.ask(t, "http", 0, desc("key", "tenant-a"))
	assert.EqualValues(t, 4, r.Statuses[0].LimitRemaining, "gRPC's bucket is full before this request")
	assert.EqualValues(t, 5, r.Statuses[0].CurrentLimit.RequestsPerUnit, "the same rule")
	h := f.get(t, "/allow?key=tenant-a")
	assert.JSONEq(t, `{"allowed":true,"remaining":1,"limit":5,"rate":5}`, h.raw)
	require.Equal(t, 200, f.get(t, "/allow?key=tenant-a").status)
	h = f.get(t, "/allow?key=tenant-a")
	assert.Equal(t, 429, h.status)
	assert.Equal(t, `"http.key_tenant-a";q=5;w=1;sluice-burst=5`, h.header.Get("RateLimit-Policy"))

	h = f.get(t, "/allow?key=tenant-a&n=6")
	assert.Equal(t, 400, h.status)
	assert.Contains(t, h.raw, "rules.yaml:")

	for range 20 {
		require.Equal(t, 200, f.get(t, "/allow?key=internal").status)
	}
	h = f.get(t, "/allow?key=%C3%BCber")
	assert.Equal(t, `"rule-line-36";q=2;w=1;sluice-burst=2`, h.header.Get("RateLimit-Policy"), "non-ASCII names are replaced in headers")
	assert.JSONEq(t, `{"allowed":true,"unlimited":true}`, f.get(t, "/allow?key=internal").raw)
	assert.JSONEq(t, `{"allowed":true,"remaining":9,"limit":10,"rate":10}`, f.get(t, "/allow?key=other").raw, "the default policy")
}

// A reload applies to the next request; an unchanged rule keeps its bucket
// state, a changed one starts full; a bad file keeps the rules in force.
func TestRLSReload(t *testing.T) {
	v1 := "domain: d\ndescriptors:\n" +
		"  - key: same\n    rate_limit: {unit: second, requests_per_unit: 5}\n" +
		"  - key: changed\n    rate_limit: {unit: second, requests_per_unit: 5}\n" +
		"  - key: removed\n    rate_limit: {unit: second, requests_per_unit: 5}\n"
	v2 := "domain: d\ndescriptors:\n" +
		"  - key: same\n    rate_limit: {unit: second, requests_per_unit: 5}\n" +
		"  - key: changed\n    rate_limit: {unit: second, requests_per_unit: 8}\n" +
		"  - key: added\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
	f := newRLS(t, v1, nil)
	for _, k := range []string{"same", "changed", "removed"} {
		for range 4 {
			f.ask(t, "d", 0, desc(k, "x"))
		}
	}
	require.NoError(t, os.WriteFile(f.file, []byte(v2), 0o600))
	require.NoError(t, f.srv.ReloadRules(f.file))

	r := f.ask(t, "d", 0, desc("same", "x"), desc("changed", "x"), desc("removed", "x"), desc("added", "x"))
	assert.Equal(t, []rlsv3.RateLimitResponse_Code{OK, OK, OK, OK, OK}, codesOf(r))
	assert.EqualValues(t, 0, r.Statuses[0].LimitRemaining, "unchanged rule: its state carried over (5-4-1)")
	assert.EqualValues(t, 7, r.Statuses[1].LimitRemaining, "changed rule: a new, full bucket of 8")
	assert.Nil(t, r.Statuses[2].CurrentLimit, "removed rule: unmatched")
	assert.EqualValues(t, 0, r.Statuses[3].LimitRemaining)
	assert.Equal(t, OVER, f.ask(t, "d", 0, desc("same", "x")).OverallCode)

	// A bad file: the error names file, line and field; v2 stays in force.
	require.NoError(t, os.WriteFile(f.file, []byte("domain: d\ndescriptors:\n  - key: same\n    rate_limit: {unit: sec, requests_per_unit: 5}\n"), 0o600))
	err := f.srv.ReloadRules(f.file)
	require.Error(t, err)
	assert.Contains(t, err.Error(), f.file+":4: descriptors[0].rate_limit.unit")
	r = f.ask(t, "d", 0, desc("changed", "x"))
	assert.EqualValues(t, 6, r.Statuses[0].LimitRemaining, "still v2's rule and bucket")
	m := f.get(t, "/metrics").raw
	assert.Contains(t, m, `sluice_config_reloads_total{result="error"} 1`)
	assert.Contains(t, m, `sluice_config_reloads_total{result="ok"} 1`)
	assert.Contains(t, m, "sluice_config_rules 3")

	// A fractional requests_per_unit is refused, not truncated (0.9 would
	// deny everything, 9.99 would be 9); v2 stays in force.
	for _, rpu := range []string{"0.9", "1.5", "9.99"} {
		require.NoError(t, os.WriteFile(f.file, []byte("domain: d\ndescriptors:\n  - key: changed\n    rate_limit: {unit: second, requests_per_unit: "+rpu+"}\n"), 0o600))
		err = f.srv.ReloadRules(f.file)
		require.Error(t, err, rpu)
		assert.Contains(t, err.Error(), f.file+`:4: descriptors[0].rate_limit.requests_per_unit: "`+rpu+`" is not a whole number`)
	}
	r = f.ask(t, "d", 0, desc("changed", "x"))
	assert.EqualValues(t, 5, r.Statuses[0].LimitRemaining, "still v2's rule and bucket")

	require.NoError(t, os.Remove(f.file))
	assert.ErrorIs(t, f.srv.ReloadRules(f.file), os.ErrNotExist)
	assert.EqualValues(t, 4, f.ask(t, "d", 0, desc("changed", "x")).Statuses[0].LimitRemaining)
}

// Reloads racing with decisions: every decision sees one whole rules file.
func TestRLSReloadUnderLoad(t *testing.T) {
	a := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1000}\n"
	b := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 500}\n"
	f := newRLS(t, a, nil)
	ca, err := rules.Parse("a", []byte(a))
	require.NoError(t, err)
	cb, err := rules.Parse("b", []byte(b))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				r, err := f.rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", "v")}})
				if err != nil {
					return
				}
				l := r.Statuses[0].CurrentLimit
				ok := (l.RequestsPerUnit == 1000 && l.Unit == rlsv3.RateLimitResponse_RateLimit_SECOND) ||
					(l.RequestsPerUnit == 500 && l.Unit == rlsv3.RateLimitResponse_RateLimit_MINUTE)
				assert.True(t, ok, "%v", l)
			}
		})
	}
	for i := range 200 {
		c := ca
		if i%2 == 1 {
			c = cb
		}
		require.NoError(t, f.srv.SetRules(c))
	}
	cancel()
	wg.Wait()
}

// With Redis killed, descriptors follow the fail mode; unmatched ones stay OK.
func TestRLSFailModesRedisKilled(t *testing.T) {
	for _, open := range []bool{true, false} {
		name := map[bool]string{true: "open", false: "closed"}[open]
		t.Run(name, func(t *testing.T) {
			rs := redistest.Start(t)
			st, err := redisstore.Open(rs.URL())
			require.NoError(t, err)
			t.Cleanup(func() { _ = st.Close() })
			c, err := rules.Parse("r.yaml", []byte(rlsRules))
			require.NoError(t, err)
			srv, err := service.New(service.Config{
				Store:   st,
				Default: store.Policy{Rate: 1, Burst: 1},
				Fail:    failMode(open),
				// Long enough that a loaded machine cannot fail the healthy
				// call; a killed Redis refuses connections at once anyway.
				StoreTimeout: 5 * time.Second,
				Rules:        c,
				Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
			})
			require.NoError(t, err)
			f := &rlsFixture{rls: serveGRPC(t, srv)}
			ts := httptest.NewServer(srv)
			t.Cleanup(ts.Close)

			ip := desc("client_ip", "203.0.113.9")
			r := f.ask(t, "edge", 0, ip)
			require.Equal(t, OK, r.OverallCode)
			require.EqualValues(t, 9, r.Statuses[0].LimitRemaining, "Redis decides")

			rs.Kill()
			r = f.ask(t, "edge", 0, ip, desc("fax", "1"))
			if open {
				assert.Equal(t, []rlsv3.RateLimitResponse_Code{OK, OK, OK}, codesOf(r))
				assert.Nil(t, r.Statuses[0].DurationUntilReset)
			} else {
				assert.Equal(t, []rlsv3.RateLimitResponse_Code{OVER, OVER, OK}, codesOf(r))
				assert.Equal(t, time.Second, r.Statuses[0].DurationUntilReset.AsDuration())
			}
			assert.EqualValues(t, 10, r.Statuses[0].CurrentLimit.RequestsPerUnit)
			fr := (&fixture{ts: ts}).get(t, "/metrics").raw
			assert.Contains(t, fr, `sluice_store_errors_total{store="redis"} 1`)
			assert.Contains(t, fr, `sluice_decisions_total{policy="edge.client_ip",result="store_error"} 1`)
		})
	}
}

// Three replicas of the service, each with its own gRPC listener, on one
// shared store: on a hand-driven clock the sum they allow is exactly
// burst + rate·T (never more), whoever asks.
func TestRLSThreeReplicasShareALimit(t *testing.T) {
	c := &vclock{now: time.Hour}
	mem := store.NewMemory(store.WithClock(c.Now))
	t.Cleanup(func() { _ = mem.Close() })
	rs, err := rules.Parse("r.yaml", []byte("domain: api\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 20}\n"))
	require.NoError(t, err)
	var replicas [3]rlsv3.RateLimitServiceClient
	for i := range replicas {
		srv, err := service.New(service.Config{Store: mem, Default: store.Policy{Rate: 1, Burst: 1}, Rules: rs,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		require.NoError(t, err)
		replicas[i] = serveGRPC(t, srv)
	}
	allowed := 0
	const step, steps = 10 * time.Millisecond, 200
	for k := range steps {
		if k > 0 {
			c.Advance(step)
		}
		for _, r := range replicas {
			f := &rlsFixture{rls: r}
			if f.ask(t, "api", 0, desc("tenant", "acme")).OverallCode == OK {
				allowed++
			}
		}
	}
	T := time.Duration(steps-1) * step // first to last decision
	bound := 20*T.Seconds() + 20
	assert.LessOrEqual(t, float64(allowed), bound)
	assert.Equal(t, 20+39, allowed, "the burst, then one every 50 ms for 1.99 s")
}
