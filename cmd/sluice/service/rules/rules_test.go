package rules_test

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The examples of envoyproxy/ratelimit's README, in our own words: a
// database with two named limits, nested marketing limits, a blocked
// address among per-address limits, an exact-depth match, unlimited keys,
// a shadow rule and wildcard values, one domain per document.
const examples = `
domain: storage
descriptors:
  - key: table
    value: orders
    rate_limit: {unit: second, requests_per_unit: 400}
  - key: table
    value: audit
    rate_limit: {unit: second, requests_per_unit: 50}
---
domain: sms
descriptors:
  # promotions: 3 a day to each phone
  - key: kind
    value: promo
    descriptors:
      - key: phone
        rate_limit:
          unit: day
          requests_per_unit: 3
  # anything: 40 a day to each phone
  - key: phone
    rate_limit:
      unit: day
      requests_per_unit: 40
---
domain: per_ip
descriptors:
  - key: client_ip
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: client_ip
    value: 192.0.2.66
    rate_limit: {unit: second, requests_per_unit: 0}
---
domain: depth
descriptors:
  - key: app
    value: shop
    descriptors:
      - key: route
        rate_limit: {unit: minute, requests_per_unit: 600}
---
domain: inside
descriptors:
  - key: backup
    rate_limit: {unlimited: true}
  - key: reports
    rate_limit: {unit: minute, requests_per_unit: 30}
---
domain: trial
descriptors:
  - key: tenant
    descriptors:
      - key: plan
        value: free
        shadow_mode: true
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: plan
        value: paid
        rate_limit: {unit: second, requests_per_unit: 50}
---
domain: files
descriptors:
  - key: path
    value: /img/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: path
    value: /api/*/edit
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 100}
`

func kv(pairs ...string) []rules.KV {
	var out []rules.KV
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, rules.KV{Key: pairs[i], Value: pairs[i+1]})
	}
	return out
}

func TestMatchExamples(t *testing.T) {
	c, err := rules.Parse("examples.yaml", []byte(examples))
	require.NoError(t, err)
	assert.Equal(t, []string{"storage", "sms", "per_ip", "depth", "inside", "trial", "files"}, c.Domains())

	name := func(domain string, entries ...string) string {
		r := rules.Match(c, domain, kv(entries...))
		if r == nil {
			return "<none>"
		}
		return r.Name
	}
	for _, tc := range []struct {
		domain  string
		entries []string
		want    string
	}{
		{"storage", []string{"table", "orders"}, "storage.table_orders"},
		{"storage", []string{"table", "users"}, "<none>"}, // no key-only rule
		{"sms", []string{"kind", "promo", "phone", "555"}, "sms.kind_promo.phone"},
		{"sms", []string{"phone", "555"}, "sms.phone"},
		{"sms", []string{"kind", "promo"}, "<none>"}, // a placeholder: no rate_limit
		{"sms", []string{"kind", "news", "phone", "555"}, "<none>"},
		{"per_ip", []string{"client_ip", "198.51.100.1"}, "per_ip.client_ip"},
		{"per_ip", []string{"client_ip", "192.0.2.66"}, "per_ip.client_ip_192.0.2.66"}, // exact beats key-only
		{"depth", []string{"app", "shop"}, "<none>"},                                   // too short
		{"depth", []string{"app", "shop", "route", "/cart"}, "depth.app_shop.route"},
		{"depth", []string{"app", "shop", "route", "/cart", "x", "y"}, "<none>"}, // too long
		{"inside", []string{"backup", "nightly"}, "inside.backup"},
		{"trial", []string{"tenant", "t1", "plan", "free"}, "trial.tenant.plan_free"},
		{"files", []string{"path", "/img/a.png"}, "files.path_/img/*"},
		{"files", []string{"path", "/api/7/edit"}, "files.path_/api/*/edit"},
		{"files", []string{"path", "/api/7/view"}, "files.path"},
		{"nowhere", []string{"path", "/"}, "<none>"},
	} {
		assert.Equal(t, tc.want, name(tc.domain, tc.entries...), "%s %v", tc.domain, tc.entries)
	}

	r := rules.Match(c, "inside", kv("backup", "x"))
	assert.True(t, r.Unlimited)
	_, limited := r.Policy()
	assert.False(t, limited)
	r = rules.Match(c, "per_ip", kv("client_ip", "192.0.2.66"))
	_, limited = r.Policy()
	assert.False(t, limited, "requests_per_unit 0 needs no bucket: it denies everything")
	assert.True(t, rules.Match(c, "trial", kv("tenant", "t", "plan", "free")).Shadow)
	assert.False(t, rules.Match(c, "trial", kv("tenant", "t", "plan", "paid")).Shadow)
	assert.Nil(t, rules.Match[rules.KV](nil, "sms", nil))
}

// Once an entry matched by value, a failure below does not fall back to the
// key-only branch (envoyproxy/ratelimit's order).
func TestMatchDoesNotBacktrack(t *testing.T) {
	c, err := rules.Parse("f", []byte(`
domain: d
descriptors:
  - key: a
    value: "1"
    descriptors:
      - {key: b, value: x, rate_limit: {unit: second, requests_per_unit: 1}}
  - key: a
    descriptors:
      - {key: b, rate_limit: {unit: second, requests_per_unit: 2}}
`))
	require.NoError(t, err)
	assert.Nil(t, rules.Match(c, "d", kv("a", "1", "b", "y")))
	assert.Equal(t, uint32(2), rules.Match(c, "d", kv("a", "2", "b", "y")).RequestsPerUnit)
}

// YAML aliases name a block once and reuse it.
func TestParseAliases(t *testing.T) {
	c, err := rules.Parse("f", []byte(`
domain: d
descriptors:
  - key: a
    rate_limit: &small {unit: second, requests_per_unit: 2}
  - key: b
    rate_limit: *small
`))
	require.NoError(t, err)
	require.Len(t, c.Rules, 2)
	assert.Equal(t, uint32(2), rules.Match(c, "d", kv("b", "x")).RequestsPerUnit)
	assert.Equal(t, rules.Second, rules.Match(c, "d", kv("b", "x")).Unit)
}

// Aliases cannot hang the parser: a recursive one is refused as such, an
// exponentially expanding one by the expanded size, and many descriptors
// through aliases by their count.
func TestParseHostileAliases(t *testing.T) {
	_, err := rules.Parse("f", []byte("domain: d\ndescriptors: &x\n  - key: k\n    descriptors: *x\n"))
	require.ErrorIs(t, err, rules.ErrTooLarge)
	assert.Contains(t, err.Error(), "f:4: alias *x names a node that contains itself")

	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n  - key: l0\n    descriptors: &l0\n      - key: leaf\n")
	for i := 1; i <= 30; i++ {
		fmt.Fprintf(&b, "  - key: l%d\n    descriptors: &l%d\n      - {key: x, descriptors: *l%d}\n      - {key: y, descriptors: *l%d}\n", i, i, i-1, i-1)
	}
	start := time.Now()
	_, err = rules.Parse("f", []byte(b.String()))
	require.ErrorIs(t, err, rules.ErrTooLarge)
	assert.Contains(t, err.Error(), "aliases expand the rules past 250000 nodes")
	assert.Less(t, time.Since(start), 2*time.Second)

	// 101 uses of a list of 100 descriptors: 30,000 nodes, but 10,100
	// rules.
	b.Reset()
	b.WriteString("domain: d\ndescriptors:\n  - key: top\n    descriptors: &list\n")
	for i := range 100 {
		fmt.Fprintf(&b, "      - {key: k%d, rate_limit: {unit: second, requests_per_unit: 1}}\n", i)
	}
	for i := range 101 {
		fmt.Fprintf(&b, "  - key: t%d\n    descriptors: *list\n", i)
	}
	_, err = rules.Parse("f", []byte(b.String()))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "more than 10000 descriptors through aliases")
}

func TestPolicyMapping(t *testing.T) {
	for _, tc := range []struct {
		unit rules.Unit
		n    uint32
		rate float64
	}{
		{rules.Second, 10, 10},
		{rules.Minute, 600, 10},
		{rules.Hour, 36, 0.01},
		{rules.Day, 864, 0.01},
		{rules.Week, 7, 1.0 / 86400},
		{rules.Month, 30, 1.0 / 86400},
	} {
		r := &rules.Rule{Name: "n", RequestsPerUnit: tc.n, Unit: tc.unit}
		p, ok := r.Policy()
		require.True(t, ok)
		assert.InDelta(t, tc.rate, p.Rate, tc.rate*1e-12, "%d per %s", tc.n, tc.unit)
		assert.Equal(t, int64(tc.n), p.Burst, "the burst is the whole unit's allowance")
		require.NoError(t, p.Validate())
		// τ = burst·T: a drained bucket is full again after one unit.
		assert.InDelta(t, float64(tc.unit.Duration()), float64(p.Tolerance()), float64(time.Microsecond)*float64(tc.n))
	}
}

func TestBucketKey(t *testing.T) {
	c, err := rules.Parse("examples.yaml", []byte(examples))
	require.NoError(t, err)
	key := func(domain string, entries ...string) string {
		e := kv(entries...)
		return rules.BucketKey(rules.RLS, rules.Match(c, domain, e), e)
	}
	assert.Equal(t, "rls:sms|kind=promo|phone=555|3/day", key("sms", "kind", "promo", "phone", "555"))
	assert.Equal(t, "rls:sms|phone=555|40/day", key("sms", "phone", "555"))
	assert.NotEqual(t, key("sms", "phone", "555"), key("sms", "phone", "556"), "key-only rules count each value apart")
	assert.Equal(t, key("files", "path", "/img/a.png"), key("files", "path", "/img/b.png"), "share_threshold: one bucket")
	assert.Equal(t, "rls:files|path=/img/*|1000/hour", key("files", "path", "/img/a.png"))
	assert.NotEqual(t, key("files", "path", "/api/1/edit"), key("files", "path", "/api/2/edit"))
	// Separators in values are escaped, so different descriptors never collide.
	assert.Equal(t, "rls:sms|phone=a%7Cb%3Dc%25|40/day", key("sms", "phone", "a|b=c%"))
	assert.NotEqual(t, key("sms", "phone", "1|phone=2"), key("sms", "phone", "1"))

	long := key("sms", "phone", strings.Repeat("9", 300))
	assert.Len(t, long, 4+64)
	assert.True(t, strings.HasPrefix(long, "rls#"))
	assert.NotEqual(t, long, key("sms", "phone", strings.Repeat("9", 301)))

	// A literal '*' in a value is escaped: only a shared pattern keeps its
	// '*', so a value spelled like the pattern has a bucket of its own.
	assert.Equal(t, "rls:sms|phone=%2A|40/day", key("sms", "phone", "*"))

	// The API, and an override, are part of the key.
	r := rules.Match(c, "sms", kv("phone", "555"))
	assert.Equal(t, "allow:sms|phone=555|40/day", rules.BucketKey(rules.Allow, r, kv("phone", "555")))
	o := &rules.Rule{Domain: "sms", RequestsPerUnit: 40, Unit: rules.Day, Override: true}
	assert.Equal(t, "rls:sms|phone=555|override:40/day", rules.BucketKey(rules.RLS, o, kv("phone", "555")))
	assert.True(t, strings.HasPrefix(rules.BucketKey(rules.Allow, r, kv("phone", strings.Repeat("9", 300))), "allow#"))
}

// FuzzBucketKey: distinct (API, domain, override, entries, limit) never give
// one key, however the strings are spelled (separators, escapes, '*').
func FuzzBucketKey(f *testing.F) {
	f.Add("edge", "k", "v", "", "", false, "edge", "k", "v", "", "", true)
	f.Add("a|b", "c", "d", "", "", false, "a", "b|c", "d", "", "", false)
	f.Add("d", "k", "a=b", "", "", false, "d", "k=a", "b", "", "", false)
	f.Add("d", "k", "v|k=w", "", "", false, "d", "k", "v", "k", "w", false)
	f.Add("d", "k", "%7C", "", "", false, "d", "k", "|", "", "", false)
	f.Add("d", "k", "*", "", "", false, "d", "k", "%2A", "", "", false)
	f.Fuzz(func(t *testing.T, d1, k1, v1, k2, v2 string, o1 bool, e1, l1, w1, l2, w2 string, o2 bool) {
		entries := func(k, v, kk, vv string) []rules.KV {
			e := []rules.KV{{Key: k, Value: v}}
			if kk != "" {
				e = append(e, rules.KV{Key: kk, Value: vv})
			}
			return e
		}
		a := entries(k1, v1, k2, v2)
		b := entries(l1, w1, l2, w2)
		ra := &rules.Rule{Domain: d1, RequestsPerUnit: 5, Unit: rules.Second, Override: o1}
		rb := &rules.Rule{Domain: e1, RequestsPerUnit: 5, Unit: rules.Second, Override: o2}
		same := d1 == e1 && o1 == o2 && fmt.Sprint(a) == fmt.Sprint(b)
		for _, api := range []rules.API{rules.RLS, rules.Allow} {
			ka := rules.BucketKey(api, ra, a)
			if got := ka == rules.BucketKey(api, rb, b); got != same {
				t.Fatalf("%s: keys equal %v, descriptors equal %v: %q vs %q", api, got, same, ka, rules.BucketKey(api, rb, b))
			}
			if ka == rules.BucketKey(otherAPI(api), rb, b) {
				t.Fatalf("%s and %s share key %q", api, otherAPI(api), ka)
			}
			if len(ka) >= rules.MaxBucketKeyLen {
				t.Fatalf("key of %d bytes", len(ka))
			}
		}
	})
}

func otherAPI(a rules.API) rules.API {
	if a == rules.RLS {
		return rules.Allow
	}
	return rules.RLS
}

// A bad file is refused with the file, the line and the field at fault.
func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"unit typo", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minutes\n      requests_per_unit: 5\n",
			`f.yaml:5: descriptors[0].rate_limit.unit: "minutes" is not a unit`},
		{"unknown field", "domain: d\ndescriptors:\n  - key: k\n    rate_limits: {unit: second}\n",
			`f.yaml:4: descriptors[0].rate_limits: unknown field`},
		{"missing key", "domain: d\ndescriptors:\n  - value: v\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			`f.yaml:3: descriptors[0].key: missing`},
		{"no domain", "descriptors: []\n", `f.yaml:1: domain: missing`},
		{"empty domain", "domain: \"\"\n", `f.yaml:1: domain: empty`},
		{"negative rpu", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
			`f.yaml:4: descriptors[0].rate_limit.requests_per_unit: "-1" is not a whole number`},
		{"fractional rpu", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 0.9}\n",
			`f.yaml:4: descriptors[0].rate_limit.requests_per_unit: "0.9" is not a whole number`},
		{"fractional rpu 1.5", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1.5\n",
			`f.yaml:6: descriptors[0].rate_limit.requests_per_unit: "1.5" is not a whole number`},
		{"fractional rpu 9.99", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 9.99}\n",
			`f.yaml:4: descriptors[0].rate_limit.requests_per_unit: "9.99" is not a whole number`},
		{"rpu over uint32", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4.3e9}\n",
			`f.yaml:4: descriptors[0].rate_limit.requests_per_unit: "4.3e9" is not a whole number from 0 to 4294967295`},
		{"rpu infinite", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: .inf}\n",
			`f.yaml:4: descriptors[0].rate_limit.requests_per_unit: ".inf" is not a whole number`},
		{"rpu string", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: \"5\"}\n",
			`f.yaml:4: descriptors[0].rate_limit.requests_per_unit: "5" is not a whole number`},
		{"missing unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1}\n",
			`f.yaml:4: descriptors[0].rate_limit.unit: missing`},
		{"unit with unlimited", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n",
			`f.yaml:4: descriptors[0].rate_limit.unit: must not be given with unlimited: true`},
		{"duplicate", "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
			`f.yaml:5: descriptors[1]: key "k" with value "v" is configured twice`},
		{"nested", "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
			`f.yaml:6: descriptors[0].descriptors[0].rate_limit.unit: "fortnight" is not a unit`},
		{"year", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 1}\n",
			`f.yaml:4: descriptors[0].rate_limit.unit: year is not supported; at most month`},
		{"replaces not a list", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces: x\n",
			`f.yaml:7: descriptors[0].rate_limit.replaces: want a list of {name: NAME}`},
		{"replaces unknown field", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces: [{nam: x}]\n",
			`f.yaml:7: descriptors[0].rate_limit.replaces[0].nam: unknown field (want name)`},
		{"replaces own name, name after", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: n}], name: n}\n",
			`f.yaml:4: descriptors[0].rate_limit.replaces[0].name: "n" is this rule's own name`},
		{"quota without rate_limit", "domain: d\ndescriptors:\n  - key: k\n    quota_mode: true\n",
			`f.yaml:4: descriptors[0].quota_mode: needs a rate_limit on the same descriptor`},
		{"unit_multiplier 0", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, unit_multiplier: 0, requests_per_unit: 1}\n",
			`f.yaml:4: descriptors[0].rate_limit.unit_multiplier: "0" is not a whole number from 1 to 4294967295`},
		{"unit_multiplier with unlimited", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit_multiplier: 5}\n",
			`f.yaml:4: descriptors[0].rate_limit.unit_multiplier: must not be given with unlimited: true`},
		{"unit_multiplier past the stores' bound", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, unit_multiplier: 60, requests_per_unit: 1}\n",
			`f.yaml:4: descriptors[0].rate_limit.unit_multiplier: 60 day is past the 52-day maximum period`},
		{"metadata not a mapping", "domain: d\ndescriptors:\n  - key: k\n    metadata: [a]\n",
			`f.yaml:4: descriptors[0].metadata: want a mapping`},
		{"share without wildcard", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n",
			`f.yaml:3: descriptors[0].share_threshold: needs a value with a '*' wildcard`},
		{"syntax", "domain: d\ndescriptors:\n  - key: [\n", `f.yaml:3: bad YAML`},
		{"domain twice", "domain: d\n---\ndomain: d\n", `f.yaml:3: domain: "d" is configured twice (first in f.yaml`},
		{"empty file", "", `f.yaml: no domain configured`},
		{"shadow bool", "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: sometimes\n",
			`f.yaml:4: descriptors[0].shadow_mode: "sometimes" is not true or false`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := rules.Parse("f.yaml", []byte(tc.yaml))
			require.Error(t, err)
			var re *rules.Error
			require.True(t, errors.As(err, &re), "%T", err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// A requests_per_unit written as a float is taken only when it is a whole
// number; the YAML decoder alone would truncate 0.9 to 0 (deny everything).
func TestParseWholeNumberSpellings(t *testing.T) {
	for v, want := range map[string]uint32{"5": 5, "10.0": 10, "1e3": 1000, "0x10": 16, "1_000": 1000, "0": 0, "4294967295": math.MaxUint32} {
		c, err := rules.Parse("f.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: "+v+"}\n"))
		require.NoError(t, err, v)
		assert.Equal(t, want, c.Rules[0].RequestsPerUnit, v)
	}
}

// A file over MaxFileSize is refused before any of it is parsed: by Load
// without reading past the cap, and by Parse.
func TestFileSizeCap(t *testing.T) {
	small := "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 3}\n"
	pad := "# " + strings.Repeat("x", 1021) + "\n" // 1 KiB of comment
	big := small + strings.Repeat(pad, rules.MaxFileSize/len(pad)+1)
	require.Greater(t, len(big), rules.MaxFileSize)
	p := filepath.Join(t.TempDir(), "big.yaml")
	require.NoError(t, os.WriteFile(p, []byte(big), 0o600))
	_, err := rules.Load(p)
	var re *rules.Error
	require.ErrorAs(t, err, &re)
	assert.Equal(t, p+": file is over the 8 MiB maximum (8388608 bytes)", err.Error())
	_, err = rules.Parse("big.yaml", []byte(big))
	require.ErrorAs(t, err, &re)
	assert.Contains(t, err.Error(), "over the 8 MiB maximum")

	// A file of exactly the cap goes to the parser (whose first line stops
	// it at once: the point is only that the size passed).
	exact := "\t\n" + strings.Repeat("x", rules.MaxFileSize-2)
	require.NoError(t, os.WriteFile(p, []byte(exact), 0o600))
	_, err = rules.Load(p)
	require.ErrorAs(t, err, &re)
	assert.Contains(t, err.Error(), "bad YAML")
}

func TestLoad(t *testing.T) {
	p := filepath.Join(t.TempDir(), "r.yaml")
	require.NoError(t, os.WriteFile(p, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 3}\n"), 0o600))
	c, err := rules.Load(p)
	require.NoError(t, err)
	require.Len(t, c.Rules, 1)
	assert.Equal(t, 3, c.Rules[0].Line)
	assert.Equal(t, p, c.File)
	_, err = rules.Load(filepath.Join(t.TempDir(), "missing.yaml"))
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// The fields envoyproxy/ratelimit accepts beyond a limit: metadata (any
// mapping, carried), quota_mode, replaces and a name; and unit_multiplier,
// which stretches the period.
func TestParseRuleFields(t *testing.T) {
	c, err := rules.Parse("f.yaml", []byte(`
domain: d
descriptors:
  - key: a
    quota_mode: true
    metadata: {team: blue, 1: one, tags: [x, {y: 2}], nothing: null}
    rate_limit:
      name: wide
      unit: minute
      unit_multiplier: 5
      requests_per_unit: 10
  - key: b
    rate_limit:
      replaces: [{name: wide}, {name: other}]
      unit: hour
      unit_multiplier: 1
      requests_per_unit: 2
  - key: c
    metadata: {}
    rate_limit: {unit: hour, requests_per_unit: 2, replaces: null}
`))
	require.NoError(t, err)
	a, b, cr := c.Rules[0], c.Rules[1], c.Rules[2]
	assert.True(t, a.QuotaMode)
	assert.True(t, a.Named)
	assert.Equal(t, "wide", a.Name)
	assert.Equal(t, map[string]any{"team": "blue", "1": "one", "tags": []any{"x", map[string]any{"y": 2}}, "nothing": nil}, a.Metadata)
	assert.Equal(t, 5*time.Minute, a.Period())
	p, ok := a.Policy()
	require.True(t, ok)
	assert.InDelta(t, 10.0/300, p.Rate, 1e-12)
	assert.EqualValues(t, 10, p.Burst)
	assert.Equal(t, "rls:d|a=x|10/5minute", rules.BucketKey(rules.RLS, a, kv("a", "x")))

	assert.False(t, b.Named)
	assert.Equal(t, "d.b", b.Name, "the metrics label of an unnamed rule")
	assert.Equal(t, []string{"wide", "other"}, b.Replaces)
	assert.Equal(t, time.Hour, b.Period())
	assert.Equal(t, "rls:d|b=x|2/hour", rules.BucketKey(rules.RLS, b, kv("b", "x")), "a multiplier of 1 keeps the key")
	assert.False(t, b.QuotaMode)
	assert.Nil(t, b.Metadata)
	assert.Nil(t, cr.Metadata)
	assert.Nil(t, cr.Replaces)
	assert.Equal(t, "f.yaml", a.File)
}
