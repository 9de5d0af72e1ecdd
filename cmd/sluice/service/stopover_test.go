package service_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/redisstore"
	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/shmstore"
)

// anotherRules is envoyproxy/ratelimit's integration test domain "another".
const anotherRules = `
domain: another
descriptors:
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: key3
    rate_limit:
      unit: hour
      requests_per_unit: 10
`

// The scenario of envoyproxy/ratelimit's integration test for
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: 15 requests of two descriptors,
// key2 (20 a minute) and key3 (10 an hour). From the 11th on key3 is over,
// and with StopOverLimitIncrement key2 keeps its 10 tokens; without it key2
// spends on and on. On every store.
func TestRLSStopOverLimitIncrement(t *testing.T) {
	stores := map[string]func(t *testing.T) store.Store{
		"memory": func(t *testing.T) store.Store { return store.NewMemory() },
		"shm": func(t *testing.T) store.Store {
			s, err := shmstore.Open(t.TempDir())
			require.NoError(t, err)
			return s
		},
		"redis": func(t *testing.T) store.Store {
			s, err := redisstore.Open(redistest.Start(t).URL())
			require.NoError(t, err)
			return s
		},
		"redis-cluster": func(t *testing.T) store.Store {
			rs := redistest.StartCluster(t)
			s, err := redisstore.OpenCluster("rediscluster://" + rs.Addr())
			require.NoError(t, err)
			return s
		},
	}
	for name, open := range stores {
		for _, stop := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stop=%v", name, stop), func(t *testing.T) {
				st := open(t)
				t.Cleanup(func() { _ = st.Close() })
				file := filepath.Join(t.TempDir(), "rules.yaml")
				require.NoError(t, os.WriteFile(file, []byte(anotherRules), 0o600))
				c, err := rules.Load(file)
				require.NoError(t, err)
				f := newFixture(t, func(cfg *service.Config) {
					cfg.Store, cfg.Rules, cfg.StopOverLimitIncrement = st, c, stop
				})
				rls := serveGRPC(t, f.srv)
				f2 := &rlsFixture{fixture: f, rls: rls}
				for i := range 15 {
					r := f2.ask(t, "another", 1, desc("key2", "v"), desc("key3", "v"))
					want := []rlsv3.RateLimitResponse_Code{OK, OK, OK}
					rem2, rem3 := uint32(20-(i+1)), uint32(10-(i+1))
					if i >= 10 {
						want = []rlsv3.RateLimitResponse_Code{OVER, OK, OVER}
						rem3 = 0
						if stop {
							rem2 = 10 // nothing spent on key2 once key3 is over
						}
					}
					require.Equal(t, want, codesOf(r), "request %d", i+1)
					assert.Equal(t, rem2, r.Statuses[0].LimitRemaining, "request %d: key2", i+1)
					assert.Equal(t, rem3, r.Statuses[1].LimitRemaining, "request %d: key3", i+1)
					assert.NotNil(t, r.Statuses[0].DurationUntilReset)
				}
			})
		}
	}
}

// A descriptor over without asking the store (requests_per_unit 0) stops
// the others' spending too.
func TestRLSStopOverLimitIncrementZeroRule(t *testing.T) {
	f := newRLS(t, anotherRules+"  - key: never\n    rate_limit: {unit: second, requests_per_unit: 0}\n",
		func(cfg *service.Config) { cfg.StopOverLimitIncrement = true })
	for range 3 {
		r := f.ask(t, "another", 1, desc("key2", "z"), desc("never", "x"))
		assert.Equal(t, []rlsv3.RateLimitResponse_Code{OVER, OK, OVER}, codesOf(r))
		assert.EqualValues(t, 20, r.Statuses[0].LimitRemaining, "key2 spends nothing")
	}
}

// A store that cannot decide several descriptors as one is refused.
func TestStopOverLimitIncrementNeedsAllOrNothing(t *testing.T) {
	_, err := service.New(service.Config{Store: plainStore{store.NewMemory()}, Default: store.Policy{Rate: 1, Burst: 1},
		StopOverLimitIncrement: true})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cannot decide several descriptors as one")
}

// plainStore hides the memory store's DecideAll.
type plainStore struct{ store.Store }
