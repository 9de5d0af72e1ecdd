package service_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/sluice-go/sluice/cmd/sluice/redisstore"
	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/sharedbucket"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/shmstore"
)

// withOverride is d with a limit override of rpu per second.
func withOverride(d *ratelimitv3.RateLimitDescriptor, rpu uint32) *ratelimitv3.RateLimitDescriptor {
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: typev3.RateLimitUnit_SECOND}
	return d
}

func tableFiles(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*"+sharedbucket.TableExt))
	require.NoError(t, err)
	return files
}

// 100 distinct limit overrides (1001 a day, 1002 a day, …) hold the buckets
// of at most DefaultMaxOverrides on every store: keys on the memory and
// Redis stores, table files on the shm store.
func TestOverrideBucketsBounded(t *testing.T) {
	for _, name := range []string{"memory", "shm", "redis"} {
		t.Run(name, func(t *testing.T) {
			var st store.Store
			var count func() int
			switch name {
			case "memory":
				st = store.NewMemory()
			case "shm":
				dir := t.TempDir()
				sh, err := shmstore.Open(dir, sharedbucket.WithSlots(64))
				require.NoError(t, err)
				st, count = sh, func() int { return len(tableFiles(t, dir)) }
			case "redis":
				rs, err := redisstore.Open(redistest.Start(t).URL())
				require.NoError(t, err)
				st = rs
			}
			t.Cleanup(func() { _ = st.Close() })
			if count == nil {
				count = func() int {
					n, err := st.Keys(context.Background())
					require.NoError(t, err)
					return int(n)
				}
			}
			// The domain, without rules: overrides count only in a
			// configured domain, and a rule would add a table of its own.
			c, err := rules.Parse("r.yaml", []byte("domain: edge\n"))
			require.NoError(t, err)
			srv, err := service.New(service.Config{Store: st, Default: store.Policy{Rate: 1, Burst: 1}, Rules: c,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			require.NoError(t, err)
			f := &rlsFixture{rls: serveGRPC(t, srv)}
			for i := range 100 {
				d := desc("remote_address", "198.51.100.7")
				d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: uint32(1001 + i), Unit: typev3.RateLimitUnit_DAY}
				f.ask(t, "edge", 0, d)
			}
			want := 64
			if name == "shm" {
				want++ // the default policy's table, opened by New
			}
			assert.Equal(t, want, count(), "buckets (shm: table files)")
		})
	}
}

// rlsDirect returns srv's ShouldRateLimit as a plain call (no network), for
// tests in a synctest bubble.
func rlsDirect(srv *service.Server) rlsv3.RateLimitServiceServer {
	var c capture
	srv.RegisterRateLimitService(&c)
	return c.impl.(rlsv3.RateLimitServiceServer)
}

type capture struct{ impl any }

func (c *capture) RegisterService(_ *grpc.ServiceDesc, impl any) { c.impl = impl }

// Past the cap an override is answered as if the descriptor had none: by
// its rule where one matches, OK where none does. Each is counted; the log
// says so at most once a minute, with the count since its last line.
func TestOverrideCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := store.NewMemory()
		defer mem.Close()
		c, err := rules.Parse("r.yaml", []byte(edgeRules))
		require.NoError(t, err)
		var logs bytes.Buffer // the calls below log on this goroutine
		reg := service.NewRegistry()
		srv, err := service.New(service.Config{Store: mem, Default: store.Policy{Rate: 1, Burst: 1}, Rules: c,
			MaxOverrides: 4, Registry: reg, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		require.NoError(t, err)
		rls := rlsDirect(srv)
		ask := func(d *ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse_DescriptorStatus {
			t.Helper()
			r, err := rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
			require.NoError(t, err)
			return r.Statuses[0]
		}
		gauge := func(name string) float64 {
			mfs, err := reg.Gather()
			require.NoError(t, err)
			for _, mf := range mfs {
				if mf.GetName() == name {
					m := mf.GetMetric()[0]
					if m.GetGauge() != nil {
						return m.GetGauge().GetValue()
					}
					return m.GetCounter().GetValue()
				}
			}
			t.Fatalf("no metric %s", name)
			return 0
		}
		for i := range 4 {
			st := ask(withOverride(desc("remote_address", "198.51.100.7"), uint32(100+i)))
			require.EqualValues(t, 100+i, st.CurrentLimit.RequestsPerUnit, "admitted")
		}
		assert.EqualValues(t, 4, gauge("sluice_override_policies"))

		// Past the cap: the rule (5/s) for a descriptor it matches ...
		st := ask(withOverride(desc("remote_address", "198.51.100.7"), 500))
		assert.EqualValues(t, 5, st.CurrentLimit.RequestsPerUnit)
		assert.EqualValues(t, 4, st.LimitRemaining)
		// ... OK and nothing counted for one without a rule ...
		st = ask(withOverride(desc("user", "ann"), 501))
		assert.Equal(t, OK, st.Code)
		assert.Nil(t, st.CurrentLimit)
		// ... while admitted overrides keep their buckets.
		st = ask(withOverride(desc("user", "ann"), 101))
		assert.EqualValues(t, 101, st.CurrentLimit.RequestsPerUnit)
		assert.EqualValues(t, 100, st.LimitRemaining)

		for i := range 44 {
			ask(withOverride(desc("user", "bo"), uint32(1000+i)))
		}
		assert.EqualValues(t, 4, gauge("sluice_override_policies"))
		assert.EqualValues(t, 46, gauge("sluice_override_over_cap_total"))
		assert.Equal(t, 1, strings.Count(logs.String(), "limit override past -max-overrides"), "%s", logs.String())
		assert.Contains(t, logs.String(), "override=500/second max_overrides=4 refused=1")

		time.Sleep(time.Minute)
		ask(withOverride(desc("user", "bo"), 2000))
		assert.Equal(t, 2, strings.Count(logs.String(), "limit override past -max-overrides"))
		assert.Contains(t, logs.String(), "override=2000/second max_overrides=4 refused=46")
	})
}

// An override and a rule of the same limit keep apart buckets; the same
// override shares its bucket across requests and replicas, in its domain.
func TestOverrideBuckets(t *testing.T) {
	f := newRLS(t, edgeRules+"---\ndomain: other\n", nil)
	for range 5 {
		require.Equal(t, OK, f.ask(t, "edge", 0, desc("remote_address", "198.51.100.7")).OverallCode)
	}
	require.Equal(t, OVER, f.ask(t, "edge", 0, desc("remote_address", "198.51.100.7")).OverallCode)
	r := f.ask(t, "edge", 0, withOverride(desc("remote_address", "198.51.100.7"), 5))
	assert.EqualValues(t, 4, r.Statuses[0].LimitRemaining, "an override of the rule's limit has a bucket of its own")
	r = f.ask(t, "other", 0, withOverride(desc("remote_address", "198.51.100.7"), 5))
	assert.EqualValues(t, 4, r.Statuses[0].LimitRemaining, "and one per domain")
	r = f.ask(t, "edge", 0, withOverride(desc("remote_address", "198.51.100.7"), 5))
	assert.EqualValues(t, 3, r.Statuses[0].LimitRemaining)
}

// -max-overrides 0 (Config.MaxOverrides < 0): no override gets a bucket.
func TestOverridesOff(t *testing.T) {
	f := newRLS(t, edgeRules, func(c *service.Config) { c.MaxOverrides = -1 })
	r := f.ask(t, "edge", 0, withOverride(desc("remote_address", "198.51.100.7"), 100))
	assert.EqualValues(t, 5, r.Statuses[0].CurrentLimit.RequestsPerUnit)
	m := f.get(t, "/metrics").raw
	assert.Contains(t, m, "sluice_override_policies 0")
	assert.Contains(t, m, "sluice_override_over_cap_total 1")
}

// Racing admissions: exactly the cap's worth of distinct overrides get
// buckets, and every other new one is counted past the cap.
func TestOverrideCapConcurrent(t *testing.T) {
	f := newRLS(t, edgeRules, func(c *service.Config) { c.MaxOverrides = 8 })
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 20 {
				f.ask(t, "edge", 0, withOverride(desc("user", "u"), uint32(1000+20*g+i)))
			}
		})
	}
	wg.Wait()
	m := f.get(t, "/metrics").raw
	assert.Contains(t, m, "sluice_override_policies 8\n")
	assert.Contains(t, m, "sluice_override_over_cap_total 312\n")
}
