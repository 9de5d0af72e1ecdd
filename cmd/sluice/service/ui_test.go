package service_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/service"
)

// TestSpaceSavingBound feeds a summary a skewed stream over far more
// distinct keys than it has counters and checks the Space-Saving
// guarantees: every reported count is at or above the true count and at
// most N/k above it, and every key denied more than N/k times is listed.
func TestSpaceSavingBound(t *testing.T) {
	var s service.SpaceSaving
	truth := map[string]uint64{}
	r := rand.New(rand.NewPCG(1, 2))
	const n = 200_000
	for range n {
		var k string
		switch x := r.IntN(100); {
		case x < 20:
			k = "heavy-1"
		case x < 30:
			k = "heavy-2"
		case x < 35:
			k = "heavy-3"
		default:
			k = fmt.Sprintf("ip-%d", r.IntN(50_000))
		}
		truth[k]++
		s.Add(k)
	}
	top, total := s.Top(service.HeavyCounters)
	require.EqualValues(t, n, total)
	bound := uint64(n / service.HeavyCounters)
	listed := map[string]bool{}
	for _, h := range top {
		listed[h.Key] = true
		assert.GreaterOrEqual(t, h.Count, truth[h.Key], h.Key)
		assert.LessOrEqual(t, h.Count-truth[h.Key], bound, h.Key)
		assert.LessOrEqual(t, h.Count-h.Err, truth[h.Key], "%s: Count-Err must be a lower bound", h.Key)
	}
	for k, c := range truth {
		if c > bound {
			assert.True(t, listed[k], "%s denied %d > N/k = %d times but not listed", k, c, bound)
		}
	}
	require.Equal(t, []string{"heavy-1", "heavy-2", "heavy-3"}, []string{top[0].Key, top[1].Key, top[2].Key})
}

// TestSpaceSavingNoAllocTracked: counting a key already tracked allocates
// nothing.
func TestSpaceSavingNoAllocTracked(t *testing.T) {
	var s service.SpaceSaving
	key := strings.Repeat("k", 40)
	s.Add(key)
	assert.Zero(t, testing.AllocsPerRun(1000, func() { s.Add(key) }))
	assert.Zero(t, service.HeavyAllocsTracked(key, 1000, testing.AllocsPerRun), "both windows")
}

type uiData struct {
	KeysShown bool `json:"keys_shown"`
	Policies  []struct {
		Kind, Name, Path string
		AllowedTotal     uint64             `json:"allowed_total"`
		DeniedTotal      uint64             `json:"denied_total"`
		TopMinute        []service.HeavyKey `json:"top_denied_minute"`
		TopQuarter       []service.HeavyKey `json:"top_denied_15m"`
		History          [][2]float64       `json:"history"`
	} `json:"policies"`
	Store struct {
		Kind    string
		Healthy bool
		Fail    string
		Latency *service.UILatency
	} `json:"store"`
	Config struct {
		Files        []string `json:"files"`
		ReloadOK     bool     `json:"last_reload_ok"`
		Error        string   `json:"last_reload_error"`
		ReloadsFails int64    `json:"reloads_failed"`
	} `json:"config"`
}

func (f *fixture) uiData(t *testing.T) uiData {
	t.Helper()
	r := f.get(t, "/ui/data")
	require.Equal(t, 200, r.status, r.raw)
	var d uiData
	require.NoError(t, json.Unmarshal([]byte(r.raw), &d))
	return d
}

// drive sends /allow for key n times.
func (f *fixture) drive(t *testing.T, key string, n int) {
	t.Helper()
	for range n {
		r := f.get(t, "/allow?key="+key)
		require.Contains(t, []int{200, 429}, r.status, r.raw)
	}
}

// TestUIShowsPoliciesAndDeniedKeys: the page's data names each policy with
// its decisions and lists the keys denied most, most first.
func TestUIShowsPoliciesAndDeniedKeys(t *testing.T) {
	f := newFixture(t, func(c *service.Config) {
		var err error
		c.Limits, err = service.ParseLimits("tenant-a=5:5")
		require.NoError(t, err)
	})
	f.drive(t, "mallory", 10+30) // burst 10, then 30 denials
	f.drive(t, "eve", 10+20)
	f.drive(t, "bob", 10+5)
	f.drive(t, "tenant-a", 5+7)

	d := f.uiData(t)
	assert.True(t, d.KeysShown)
	assert.Equal(t, "memory", d.Store.Kind)
	assert.True(t, d.Store.Healthy)
	assert.Equal(t, "open", d.Store.Fail)
	byName := map[string]int{}
	for i, p := range d.Policies {
		byName[p.Name] = i
	}
	require.Contains(t, byName, "default")
	require.Contains(t, byName, "tenant-a")
	def := d.Policies[byName["default"]]
	assert.EqualValues(t, 30, def.AllowedTotal)
	assert.EqualValues(t, 55, def.DeniedTotal)
	require.Len(t, def.TopMinute, 3)
	assert.Equal(t, []string{"mallory", "eve", "bob"}, []string{def.TopMinute[0].Key, def.TopMinute[1].Key, def.TopMinute[2].Key})
	assert.EqualValues(t, 30, def.TopMinute[0].Count)
	assert.Zero(t, def.TopMinute[0].Err, "fewer keys than counters: exact")
	require.Len(t, def.TopQuarter, 3)
	assert.Equal(t, "mallory", def.TopQuarter[0].Key)
	assert.Len(t, def.History, service.UIHistoryBuckets)
	ta := d.Policies[byName["tenant-a"]]
	assert.EqualValues(t, 7, ta.DeniedTotal)
	assert.Equal(t, "tenant-a", ta.TopMinute[0].Key)

	// JavaScript off: the page itself carries the figures.
	page := f.get(t, "/ui")
	require.Equal(t, 200, page.status)
	assert.Contains(t, page.header.Get("Content-Type"), "text/html")
	for _, want := range []string{"tenant-a", "mallory", "eve", "bob", "55 total", "JavaScript off", "<svg"} {
		assert.Contains(t, page.raw, want)
	}
	assert.Less(t, strings.Index(page.raw, ">mallory<"), strings.Index(page.raw, ">eve<"), "most denied first")
	assert.NotContains(t, page.raw, "http://", "nothing fetched from elsewhere")
	assert.NotContains(t, page.raw, "https://")
	// Read-only.
	assert.Equal(t, 405, f.do(t, "POST", "/ui", nil, "").status)
	assert.Equal(t, 404, f.get(t, "/ui/nope").status)
	// /ui/ leads to /ui, where the page's relative links resolve.
	req, err := http.NewRequest(http.MethodGet, f.ts.URL+"/ui/", nil)
	require.NoError(t, err)
	resp, err := http.DefaultTransport.RoundTrip(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusMovedPermanently, resp.StatusCode)
	assert.Equal(t, "../ui", resp.Header.Get("Location"))
}

// TestUIHidesKeys: with UIHideKeys the page shows keyed hashes, never the
// keys, and one key keeps one hash.
func TestUIHidesKeys(t *testing.T) {
	f := newFixture(t, func(c *service.Config) { c.UIHideKeys = true })
	f.drive(t, "203.0.113.7", 15)
	d := f.uiData(t)
	assert.False(t, d.KeysShown)
	top := d.Policies[0].TopMinute
	require.Len(t, top, 1)
	assert.Regexp(t, `^#[0-9a-f]{16}$`, top[0].Key)
	assert.EqualValues(t, 5, top[0].Count)
	page := f.get(t, "/ui").raw
	assert.NotContains(t, page, "203.0.113.7")
	assert.Contains(t, page, top[0].Key)
	assert.Contains(t, f.get(t, "/ui/data").raw, top[0].Key)
}

// TestUIShowsReloadError: a failed reload shows its error in full, and
// the files in force stay listed.
func TestUIShowsReloadError(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "rules.yaml")
	require.NoError(t, os.WriteFile(good, []byte("domain: http\ndescriptors:\n  - key: key\n    value: alice\n    rate_limit: {unit: second, requests_per_unit: 2}\n"), 0o600))
	f := newFixture(t, nil)
	require.NoError(t, f.srv.ReloadRules(good))
	f.drive(t, "alice", 5)
	d := f.uiData(t)
	assert.True(t, d.Config.ReloadOK)
	assert.Equal(t, []string{good}, d.Config.Files)
	var rule bool
	for _, p := range d.Policies {
		if p.Kind == "rule" {
			rule = true
			assert.Equal(t, "key=alice", p.Path)
			assert.EqualValues(t, 3, p.DeniedTotal)
		}
	}
	assert.True(t, rule, "the rule is a policy on the page")

	require.NoError(t, os.WriteFile(good, []byte("domain: http\ndescriptors:\n  - key: key\n    rate_limit: {unit: fortnight, requests_per_unit: 2}\n"), 0o600))
	err := f.srv.ReloadRules(good)
	require.Error(t, err)
	d = f.uiData(t)
	assert.False(t, d.Config.ReloadOK)
	assert.Equal(t, err.Error(), d.Config.Error, "the error in full")
	assert.EqualValues(t, 1, d.Config.ReloadsFails)
	assert.Equal(t, []string{good}, d.Config.Files, "the files in force")
	assert.Contains(t, f.get(t, "/ui").raw, "fortnight", "the page shows the error")
}

// TestUILatencyCountsFromStart: in a server's first minute the page's store
// latency covers every decision since the start, including those made
// before the page's first sample.
func TestUILatencyCountsFromStart(t *testing.T) {
	f := newFixture(t, nil)
	f.drive(t, "a", 5) // before any sample: the fixture runs no sampler
	d := f.uiData(t)   // the page load takes the first sample
	require.NotNil(t, d.Store.Latency)
	assert.EqualValues(t, 5, d.Store.Latency.Count)
}
