package service_test

import (
	"bytes"
	"context"
	"log/slog"
	"math"
	"math/big"
	"os"
	"sync"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-go/sluice/cmd/sluice/service"
)

// A limit override whose unit × unit_multiplier would wrap int64 to a short
// period (60 s × 307,445,735 is 26 s once wrapped) is refused with
// InvalidArgument, for every unit a uint32 multiplier can wrap; a period
// just past 52 days too, and exactly 52 days is taken.
func TestRLSOverridePeriodOverflow(t *testing.T) {
	f := newRLS(t, rlsRules, nil)
	two64 := new(big.Int).Lsh(big.NewInt(1), 64)
	for unit, ns := range map[typev3.RateLimitUnit]int64{
		typev3.RateLimitUnit_MINUTE: 60e9,
		typev3.RateLimitUnit_HOUR:   3600e9,
		typev3.RateLimitUnit_DAY:    86400e9,
		typev3.RateLimitUnit_MONTH:  30 * 86400e9,
	} {
		m := new(big.Int).Add(new(big.Int).Div(two64, big.NewInt(ns)), big.NewInt(1)) // ⌈2⁶⁴/unit⌉
		require.LessOrEqual(t, m.Uint64(), uint64(math.MaxUint32))
		d := desc("anything", unit.String())
		d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1000, Unit: unit,
			UnitMultiplier: wrapperspb.UInt32(uint32(m.Uint64()))}
		r, err := f.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
		if err == nil {
			t.Errorf("%s × %d accepted: current_limit %v, duration_until_reset %v", unit, m, r.Statuses[0].CurrentLimit, r.Statuses[0].DurationUntilReset.AsDuration())
			continue
		}
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "%s: %v", unit, err)
		assert.Contains(t, status.Convert(err).Message(), "past the 52-day maximum period", unit)
	}
	for mult, ok := range map[uint32]bool{52: true, 53: false} {
		d := desc("anything", "days")
		d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_DAY, UnitMultiplier: wrapperspb.UInt32(mult)}
		_, err := f.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
		if ok {
			assert.NoError(t, err, mult)
		} else {
			assert.Equal(t, codes.InvalidArgument, status.Code(err), mult)
		}
	}
}

// An override in years says so plainly.
func TestRLSOverrideYear(t *testing.T) {
	f := newRLS(t, rlsRules, nil)
	d := desc("anything", "x")
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_YEAR}
	_, err := f.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	assert.Equal(t, "descriptor 0: limit override: unit YEAR is not supported; at most MONTH (periods are at most 52 days)", status.Convert(err).Message())
}

// syncBuffer is a bytes.Buffer safe for a logger and a test at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Rules that replace one another in a cycle load with a warning in the log,
// at start and at each reload.
func TestRulesReplacesCycleLogged(t *testing.T) {
	const cycle = `
domain: edge
descriptors:
  - key: a
    rate_limit: {name: A, unit: minute, requests_per_unit: 1, replaces: [{name: B}]}
  - key: b
    rate_limit: {name: B, unit: minute, requests_per_unit: 1, replaces: [{name: A}]}
`
	var log syncBuffer
	f := newRLS(t, cycle, func(cfg *service.Config) { cfg.Logger = slog.New(slog.NewTextHandler(&log, nil)) })
	assert.Contains(t, log.String(), `level=WARN msg="rules warning"`)
	assert.Contains(t, log.String(), `replace one another in a cycle: \"A\" (`+f.file+`:4) replaces \"B\", \"B\" (`+f.file+`:6) replaces \"A\"`)

	// Both rules match: neither limits (as envoyproxy/ratelimit answers).
	for range 3 {
		r := f.ask(t, "edge", 0, desc("a", "1"), desc("b", "1"))
		assert.Equal(t, OK, r.OverallCode)
	}

	require.NoError(t, os.WriteFile(f.file, []byte(cycle), 0o600))
	before := bytes.Count([]byte(log.String()), []byte("in a cycle"))
	require.NoError(t, f.srv.ReloadRules(f.file))
	assert.Equal(t, before+1, bytes.Count([]byte(log.String()), []byte("in a cycle")))
}
