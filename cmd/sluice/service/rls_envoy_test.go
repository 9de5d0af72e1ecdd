package service_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
)

// A rule that replaces another removes that rule's limit from the answer of
// a request matching both (envoyproxy/ratelimit's README, example 7, in our
// words): the replaced descriptor is OK with no current_limit and its
// bucket is untouched; alone, it is limited as usual.
func TestRLSReplaces(t *testing.T) {
	f := newRLS(t, `
domain: shop
descriptors:
  - key: category
    value: read
    descriptors:
      - key: user
        rate_limit: {name: reads, unit: second, requests_per_unit: 2}
  - key: endpoint
    value: search
    descriptors:
      - key: user
        rate_limit:
          replaces: [{name: reads}]
          unit: second
          requests_per_unit: 5
  - key: vip
    rate_limit:
      unlimited: true
      replaces: [{name: reads}]
`, nil)
	read, search := desc("category", "read", "user", "ann"), desc("endpoint", "search", "user", "ann")
	for i := range 5 {
		r := f.ask(t, "shop", 0, read, search)
		require.Equal(t, []rlsv3.RateLimitResponse_Code{OK, OK, OK}, codesOf(r), "request %d", i+1)
		assert.Nil(t, r.Statuses[0].CurrentLimit, "replaced: no limit")
		assert.EqualValues(t, 4-i, r.Statuses[1].LimitRemaining)
	}
	assert.Equal(t, OVER, f.ask(t, "shop", 0, read, search).OverallCode, "the replacing rule's own limit holds")
	r := f.ask(t, "shop", 0, read)
	assert.Equal(t, OK, r.OverallCode)
	assert.EqualValues(t, 1, r.Statuses[0].LimitRemaining, "the replaced rule's bucket was not spent")
	assert.Equal(t, "reads", r.Statuses[0].CurrentLimit.Name, "a named rule sends its name")

	// An unlimited rule replaces too.
	for range 3 {
		r = f.ask(t, "shop", 0, read, desc("vip", "yes"))
		assert.Equal(t, []rlsv3.RateLimitResponse_Code{OK, OK, OK}, codesOf(r))
		assert.Nil(t, r.Statuses[0].CurrentLimit)
	}
}

// quota_mode: a quota rule over its limit says OVER_LIMIT for itself but
// leaves the request OK, unless every quota descriptor of the request is
// over; a rule without quota_mode over its limit still makes it OVER_LIMIT.
func TestRLSQuotaMode(t *testing.T) {
	f := newRLS(t, `
domain: q
descriptors:
  - key: daily
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: monthly
    quota_mode: true
    rate_limit: {unit: month, requests_per_unit: 3}
  - key: rate
    rate_limit: {unit: second, requests_per_unit: 1}
`, nil)
	daily, monthly := desc("daily", "ann"), desc("monthly", "ann")
	assert.Equal(t, []rlsv3.RateLimitResponse_Code{OK, OK, OK}, codesOf(f.ask(t, "q", 0, daily, monthly)))
	assert.Equal(t, []rlsv3.RateLimitResponse_Code{OK, OVER, OK}, codesOf(f.ask(t, "q", 0, daily, monthly)),
		"one quota of two over: OK")
	assert.Equal(t, []rlsv3.RateLimitResponse_Code{OK, OVER, OK}, codesOf(f.ask(t, "q", 0, daily, monthly)))
	assert.Equal(t, []rlsv3.RateLimitResponse_Code{OVER, OVER, OVER}, codesOf(f.ask(t, "q", 0, daily, monthly)),
		"every quota over: OVER_LIMIT")

	// A lone quota descriptor over its limit is every quota of its request.
	bo := desc("daily", "bo")
	assert.Equal(t, OK, f.ask(t, "q", 0, bo).OverallCode)
	assert.Equal(t, []rlsv3.RateLimitResponse_Code{OVER, OVER}, codesOf(f.ask(t, "q", 0, bo)))
	// A rule without quota_mode over its limit decides as ever.
	rate := desc("rate", "bo")
	assert.Equal(t, []rlsv3.RateLimitResponse_Code{OK, OK, OK}, codesOf(f.ask(t, "q", 0, rate, desc("monthly", "bo"))))
	assert.Equal(t, []rlsv3.RateLimitResponse_Code{OVER, OVER, OK}, codesOf(f.ask(t, "q", 0, rate, desc("monthly", "bo"))))
}

// unit_multiplier stretches a rule's period: 3 per 5 minutes refills one
// every 100 s, and Envoy's current_limit says so.
func TestRLSUnitMultiplier(t *testing.T) {
	f := newRLS(t, "domain: m\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 3}\n", nil)
	r := f.ask(t, "m", 0, desc("k", "v"))
	assert.Equal(t, OK, r.OverallCode)
	cl := r.Statuses[0].CurrentLimit
	assert.EqualValues(t, 3, cl.RequestsPerUnit)
	assert.Equal(t, rlsv3.RateLimitResponse_RateLimit_MINUTE, cl.Unit)
	assert.EqualValues(t, 5, cl.GetUnitMultiplier().GetValue())
	assert.Equal(t, 100*time.Second, r.Statuses[0].DurationUntilReset.AsDuration())
	f.ask(t, "m", 0, desc("k", "v"))
	f.ask(t, "m", 0, desc("k", "v"))
	r = f.ask(t, "m", 0, desc("k", "v"))
	assert.Equal(t, OVER, r.OverallCode)
	assert.Equal(t, 100*time.Second, r.Statuses[0].DurationUntilReset.AsDuration())
}

// metadata is carried on the rule and changes no answer.
func TestRLSMetadataNoEffect(t *testing.T) {
	plain := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2}\n"
	meta := "domain: d\ndescriptors:\n  - key: k\n    metadata: {owner: team-a, tier: [gold]}\n    rate_limit: {unit: second, requests_per_unit: 2}\n"
	a, b := newRLS(t, plain, nil), newRLS(t, meta, nil)
	for range 3 {
		ra, rb := a.ask(t, "d", 0, desc("k", "v")), b.ask(t, "d", 0, desc("k", "v"))
		assert.Equal(t, ra.String(), rb.String())
	}
}

// writeFiles makes dir hold exactly files (name → contents).
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	old, err := filepath.Glob(filepath.Join(dir, "*"))
	require.NoError(t, err)
	for _, f := range old {
		if _, keep := files[filepath.Base(f)]; !keep {
			require.NoError(t, os.Remove(f))
		}
	}
	for name, body := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600))
	}
}

// A directory of rules files reloads as one: added, changed and removed
// files all take effect; a bad file anywhere keeps every rule in force. With
// MergeDomains, two files of one domain merge; without, they are refused.
func TestRLSReloadDirectory(t *testing.T) {
	dir := t.TempDir()
	const (
		a1 = "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n"
		a2 = "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 7}\n"
		b1 = "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 3}\n"
		c1 = "domain: c\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 9}\n"
		a3 = "domain: a\ndescriptors:\n  - key: j\n    rate_limit: {unit: second, requests_per_unit: 4}\n"
	)
	writeFiles(t, dir, map[string]string{"a.yaml": a1, "b.yml": b1, "notes.txt": "not rules"})
	c, err := rules.LoadAll([]string{dir}, rules.Options{})
	require.NoError(t, err)
	f := newRLS(t, "domain: unused\n", func(cfg *service.Config) { cfg.Rules = c })
	limit := func(domain, key string) uint32 {
		t.Helper()
		return f.ask(t, domain, 0, desc(key, "x")).Statuses[0].GetCurrentLimit().GetRequestsPerUnit()
	}
	assert.EqualValues(t, 5, limit("a", "k"))
	assert.EqualValues(t, 3, limit("b", "k"))

	// a changed, b removed, c added: one reload sees all three.
	writeFiles(t, dir, map[string]string{"a.yaml": a2, "c.yaml": c1})
	require.NoError(t, f.srv.ReloadRules(dir))
	assert.EqualValues(t, 7, limit("a", "k"))
	assert.EqualValues(t, 0, limit("b", "k"), "b's file removed: no limit")
	assert.EqualValues(t, 9, limit("c", "k"))

	// A bad file beside good ones: nothing changes, the error names it.
	writeFiles(t, dir, map[string]string{"a.yaml": a1, "c.yaml": c1, "z.yaml": "domain: z\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"})
	err = f.srv.ReloadRules(dir)
	assert.ErrorContains(t, err, filepath.Join(dir, "z.yaml")+`:4: descriptors[0].rate_limit.unit: "fortnight" is not a unit`)
	assert.EqualValues(t, 7, limit("a", "k"), "a's change waits for a good directory")

	// Two files of one domain: refused without merging, naming both.
	writeFiles(t, dir, map[string]string{"a.yaml": a1, "a-more.yaml": a3})
	err = f.srv.ReloadRules(dir)
	assert.ErrorContains(t, err, filepath.Join(dir, "a.yaml")+`:1: domain: "a" is configured twice (first in `+filepath.Join(dir, "a-more.yaml"))
	assert.EqualValues(t, 9, limit("c", "k"), "still the rules in force")
}

// With Config.RulesOptions.MergeDomains, ReloadRules merges one domain's
// files, and a file list may name files and directories.
func TestRLSReloadMergeDomains(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"a.yaml":      "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
		"a-more.yaml": "domain: a\ndescriptors:\n  - key: j\n    rate_limit: {unit: second, requests_per_unit: 4}\n",
	})
	extra := filepath.Join(t.TempDir(), "extra.yaml")
	require.NoError(t, os.WriteFile(extra, []byte("domain: a\ndescriptors:\n  - key: i\n    rate_limit: {unit: second, requests_per_unit: 2}\n"), 0o600))
	f := newRLS(t, "domain: unused\n", func(cfg *service.Config) { cfg.RulesOptions.MergeDomains = true })
	require.NoError(t, f.srv.ReloadRules(dir, extra))
	r := f.ask(t, "a", 0, desc("k", "x"), desc("j", "x"), desc("i", "x"))
	assert.EqualValues(t, 5, r.Statuses[0].GetCurrentLimit().GetRequestsPerUnit())
	assert.EqualValues(t, 4, r.Statuses[1].GetCurrentLimit().GetRequestsPerUnit())
	assert.EqualValues(t, 2, r.Statuses[2].GetCurrentLimit().GetRequestsPerUnit())
	// The same top-level key and value in two files is refused even so.
	require.NoError(t, os.WriteFile(extra, []byte("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2}\n"), 0o600))
	assert.ErrorContains(t, f.srv.ReloadRules(dir, extra), extra+`:3: descriptors[0]: key "k" with value "" is configured twice`)
}
