package rules_test

import (
	"fmt"
	"math"
	"math/big"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
)

// wrappingMultiplier is the smallest unit_multiplier whose period, unit ×
// multiplier in int64 nanoseconds, wraps past 2⁶³ all the way round to a
// small positive duration (under one unit): the period an unchecked
// multiplication would enforce. ok is false when no uint32 multiplier
// wraps the unit (second: 2³²−1 seconds is 136 years, within int64).
func wrappingMultiplier(u rules.Unit) (mult uint32, wrapped time.Duration, ok bool) {
	two64 := new(big.Int).Lsh(big.NewInt(1), 64)
	unit := big.NewInt(int64(u.Duration()))
	m := new(big.Int).Add(new(big.Int).Div(two64, unit), big.NewInt(1)) // ⌈2⁶⁴/unit⌉
	if !m.IsUint64() || m.Uint64() > math.MaxUint32 {
		return 0, 0, false
	}
	rem := new(big.Int).Sub(new(big.Int).Mul(m, unit), two64)
	return uint32(m.Uint64()), time.Duration(rem.Int64()), true
}

// Every unit whose period can wrap int64 with a uint32 unit_multiplier is
// refused at load, naming the period and the 52-day maximum, instead of
// becoming the short period the wrapped product would be ("1000 per 585
// years" as 1000 per 26 s).
func TestPeriodOverflowRefused(t *testing.T) {
	for _, u := range []rules.Unit{rules.Minute, rules.Hour, rules.Day, rules.Week, rules.Month} {
		t.Run(string(u), func(t *testing.T) {
			mult, wrapped, ok := wrappingMultiplier(u)
			require.True(t, ok, "a uint32 multiplier wraps %s", u)
			require.Positive(t, wrapped)
			require.Less(t, wrapped, rules.MaxPeriod, "the wrapped period would pass a check on the product alone")
			yaml := fmt.Sprintf("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: %s, unit_multiplier: %d, requests_per_unit: 1000}\n", u, mult)
			c, err := rules.Parse("f.yaml", []byte(yaml))
			if err == nil {
				t.Fatalf("%d %s accepted as a period of %v (rate %v/s)", mult, u, c.Rules[0].Period(), mustPolicy(t, c.Rules[0]).Rate)
			}
			var re *rules.Error
			require.ErrorAs(t, err, &re)
			assert.ErrorIs(t, err, rules.ErrPeriodTooLong)
			assert.Contains(t, err.Error(), fmt.Sprintf("f.yaml:4: descriptors[0].rate_limit.unit_multiplier: %d %s is past the 52-day maximum period", mult, u))

			// The arithmetic behind it never wraps either.
			_, err = rules.PeriodOf(u, mult)
			assert.ErrorIs(t, err, rules.ErrPeriodTooLong)
			r := &rules.Rule{Unit: u, UnitMultiplier: mult, RequestsPerUnit: 1000}
			assert.Equal(t, time.Duration(math.MaxInt64), r.Period(), "saturates, never wraps")
		})
	}
	// A second cannot wrap (2³²−1 seconds fit in int64): the largest
	// multiplier is still refused as past the maximum.
	_, _, ok := wrappingMultiplier(rules.Second)
	assert.False(t, ok)
	_, err := rules.Parse("f.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, unit_multiplier: 4294967295, requests_per_unit: 1}\n"))
	assert.ErrorIs(t, err, rules.ErrPeriodTooLong)
}

func mustPolicy(t *testing.T, r *rules.Rule) (p struct{ Rate float64 }) {
	t.Helper()
	pol, ok := r.Policy()
	require.True(t, ok)
	p.Rate = pol.Rate
	return p
}

// The documented maximum is exact: a period of 52 days is taken, one
// second more is refused, whatever requests_per_unit (the store's own bound,
// 2⁵² ns of tolerance, is a little above 52 days and never the one hit).
func TestPeriodMaximum(t *testing.T) {
	assert.Equal(t, 52*24*time.Hour, rules.MaxPeriod)
	for _, tc := range []struct {
		unit rules.Unit
		mult uint64
		ok   bool
	}{
		{rules.Day, 52, true},
		{rules.Day, 53, false},
		{rules.Hour, 52 * 24, true},
		{rules.Hour, 52*24 + 1, false},
		{rules.Second, 52 * 86400, true},
		{rules.Second, 52*86400 + 1, false},
		{rules.Minute, 52 * 1440, true},
		{rules.Week, 7, true},
		{rules.Week, 8, false},
		{rules.Month, 1, true},
		{rules.Month, 2, false},
	} {
		for _, rpu := range []uint32{1, 7, 1000, math.MaxUint32} {
			yaml := fmt.Sprintf("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: %s, unit_multiplier: %d, requests_per_unit: %d}\n", tc.unit, tc.mult, rpu)
			_, err := rules.Parse("f.yaml", []byte(yaml))
			if tc.ok {
				assert.NoError(t, err, "%d per %d %s", rpu, tc.mult, tc.unit)
			} else {
				assert.ErrorIs(t, err, rules.ErrPeriodTooLong, "%d per %d %s", rpu, tc.mult, tc.unit)
			}
		}
	}
}

// A year is refused with a message that says so, not with the store's
// complaint about a fractional rate and a duration in hours.
func TestYearRefusedPlainly(t *testing.T) {
	for _, spelling := range []string{"year", "YEAR", "Year"} {
		_, err := rules.Parse("f.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: "+spelling+", requests_per_unit: 1}\n"))
		require.Error(t, err)
		assert.Equal(t, `f.yaml:4: descriptors[0].rate_limit.unit: year is not supported; at most month (periods are at most 52 days)`, err.Error())
	}
}

// nestedMetadataAliases is a small rules file of domain whose first
// descriptor's metadata defines anchors m0…m{depth}, each a mapping of fan
// aliases of the one before (so m{depth} stands for about (2·fan)^depth
// nodes), and whose next uses descriptors each carry metadata: *m{depth}.
func nestedMetadataAliases(domain string, fan, depth, uses int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "domain: %s\ndescriptors:\n  - key: anchors\n    metadata:\n      list:\n        - &m0 {leaf: x}\n", domain)
	for d := 1; d <= depth; d++ {
		fmt.Fprintf(&b, "        - &m%d {", d)
		for i := range fan {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "k%d: *m%d", i, d-1)
		}
		b.WriteString("}\n")
	}
	for i := range uses {
		fmt.Fprintf(&b, "  - key: k%d\n    metadata: *m%d\n    rate_limit: {unit: second, requests_per_unit: 1}\n", i, depth)
	}
	return b.String()
}

// Metadata reached through aliases counts towards the file's expanded size:
// a file of a few KiB whose metadata would expand to millions of nodes is
// refused at once, naming the limit, having allocated little.
func TestMetadataAliasBomb(t *testing.T) {
	// *m6 stands for 1,123,473 nodes (hundreds of MiB as Go maps), each
	// use of it as much again, from a file of about 1 KiB.
	yaml := nestedMetadataAliases("d", 8, 6, 10)
	require.Less(t, len(yaml), 2<<10)

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	_, err := rules.Parse("f.yaml", []byte(yaml))
	elapsed := time.Since(start)
	runtime.ReadMemStats(&after)
	require.Error(t, err)
	var re *rules.Error
	require.ErrorAs(t, err, &re)
	assert.ErrorIs(t, err, rules.ErrTooLarge)
	assert.Contains(t, err.Error(), fmt.Sprintf("aliases expand the rules past %d nodes", rules.MaxAliasNodes))
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("refused in %v, %d KiB allocated: %v", elapsed, alloc>>10, err)
	assert.Less(t, alloc, uint64(4<<20), "bytes allocated to refuse a 3 KiB file")
}

// Aliases within the bound still work, in metadata as anywhere: each rule
// carries its own copy of the metadata.
func TestMetadataAliasesWithinBound(t *testing.T) {
	c, err := rules.Parse("f.yaml", []byte(`
domain: d
descriptors:
  - key: a
    metadata: &m {team: payments, tags: [x, y]}
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: b
    metadata: *m
    rate_limit: {unit: second, requests_per_unit: 1}
`))
	require.NoError(t, err)
	require.Len(t, c.Rules, 2)
	assert.Equal(t, c.Rules[0].Metadata, c.Rules[1].Metadata)
	assert.Equal(t, "payments", c.Rules[1].Metadata["team"])
}

// Metadata named once and used by many rules is kept once: 600 rules with
// metadata: *m (403 nodes each, 240,000 in all, under the bound) cost about
// what the file does, not 600 copies.
func TestMetadataAliasesShared(t *testing.T) {
	yaml := nestedMetadataAliases("d", 3, 4, 600)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	c, err := rules.Parse("f.yaml", []byte(yaml))
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d rules from %d KiB: %d KiB allocated", len(c.Rules), len(yaml)>>10, alloc>>10)
	require.Len(t, c.Rules, 600)
	last := c.Rules[599].Metadata
	assert.Equal(t, "x", last["k2"].(map[string]any)["k0"].(map[string]any)["k1"].(map[string]any)["k2"].(map[string]any)["leaf"])
	assert.Less(t, alloc, uint64(16<<20), "bytes allocated for a %d KiB file", len(yaml)>>10)
}

// Merge keys in metadata merge as YAML says: the mapping's own keys win,
// then the first merged mapping that gives a key.
func TestMetadataMergeKeys(t *testing.T) {
	c, err := rules.Parse("f.yaml", []byte(`
domain: d
descriptors:
  - key: a
    metadata: &base {team: core, tier: 1}
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: b
    metadata: {<<: [*base, {owner: me, tier: 3}], tier: 2, 7: seven}
    rate_limit: {unit: second, requests_per_unit: 1}
`))
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"team": "core", "tier": 2, "owner": "me", "7": "seven"}, c.Rules[1].Metadata)
	assert.Equal(t, map[string]any{"team": "core", "tier": 1}, c.Rules[0].Metadata, "the merged mapping is untouched")
}

// Aliases count across every file of one load: files that each stay under
// the bound cannot add up past it.
func TestAliasBoundPerLoad(t *testing.T) {
	// About 108,000 nodes a file (five uses of *m4, 17,553 nodes each, and
	// the anchors' own aliases): under the bound alone and twice, over it
	// three times.
	one := func(domain string) rules.Source {
		yaml := nestedMetadataAliases(domain, 8, 4, 5)
		return rules.Source{Name: domain + ".yaml", Data: []byte(yaml)}
	}
	_, err := rules.ParseAll([]rules.Source{one("a"), one("b")}, rules.Options{})
	require.NoError(t, err)
	_, err = rules.ParseAll([]rules.Source{one("a"), one("b"), one("c")}, rules.Options{})
	require.ErrorIs(t, err, rules.ErrTooLarge)
	assert.Contains(t, err.Error(), "c.yaml:")
}

// A recursive alias (a node that contains an alias to itself) is refused,
// naming it, wherever it is.
func TestRecursiveAliasRefused(t *testing.T) {
	_, err := rules.Parse("f.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    metadata: &m {self: *m}\n    rate_limit: {unit: second, requests_per_unit: 1}\n"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "f.yaml:4:")
	assert.Contains(t, err.Error(), "contains itself")
}

// Rules that replace one another in a cycle, of any length, load (as in
// envoyproxy/ratelimit, which checks only empty and own names) with a
// warning naming every rule of the cycle: a request matching them all is
// limited by none.
func TestReplacesCycleWarns(t *testing.T) {
	c, err := rules.Parse("f.yaml", []byte(`
domain: d
descriptors:
  - key: a
    rate_limit: {name: A, unit: minute, requests_per_unit: 1, replaces: [{name: B}]}
  - key: b
    rate_limit: {name: B, unit: minute, requests_per_unit: 1, replaces: [{name: A}]}
  - key: c
    rate_limit: {name: C, unit: minute, requests_per_unit: 1, replaces: [{name: D}]}
  - key: d
    rate_limit: {name: D, unit: minute, requests_per_unit: 1, replaces: [{name: E}]}
  - key: e
    rate_limit: {name: E, unit: minute, requests_per_unit: 1, replaces: [{name: C}, {name: A}]}
  - key: f
    rate_limit: {name: F, unit: minute, requests_per_unit: 1, replaces: [{name: A}]}
---
domain: other
descriptors:
  - key: x
    rate_limit: {name: X, unit: minute, requests_per_unit: 1, replaces: [{name: Y}]}
  - key: y
    rate_limit: {name: Y, unit: minute, requests_per_unit: 1, replaces: [{name: Z}]}
`))
	require.NoError(t, err)
	require.Len(t, c.Warnings, 2, "%v", c.Warnings)
	assert.Equal(t, `f.yaml:4: descriptors[0].rate_limit.replaces: rules of domain "d" replace one another in a cycle: "A" (f.yaml:4) replaces "B", "B" (f.yaml:6) replaces "A"; a request whose descriptors match all of them is limited by none`, c.Warnings[0].Error())
	assert.Equal(t, `f.yaml:8: descriptors[2].rate_limit.replaces: rules of domain "d" replace one another in a cycle: "C" (f.yaml:8) replaces "D", "D" (f.yaml:10) replaces "E", "E" (f.yaml:12) replaces "C"; a request whose descriptors match all of them is limited by none`, c.Warnings[1].Error())

	// Names are per domain: the same names in two domains never meet in
	// one request.
	c, err = rules.ParseAll([]rules.Source{
		{Name: "a.yaml", Data: []byte("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {name: A, unit: minute, requests_per_unit: 1, replaces: [{name: B}]}\n")},
		{Name: "b.yaml", Data: []byte("domain: b\ndescriptors:\n  - key: k\n    rate_limit: {name: B, unit: minute, requests_per_unit: 1, replaces: [{name: A}]}\n")},
	}, rules.Options{})
	require.NoError(t, err)
	assert.Empty(t, c.Warnings)
}

// YAML structure errors name the line at fault, not the line where the
// enclosing block began.
func TestYAMLErrorLines(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"tab in indentation", "domain: d\ndescriptors:\n  - key: a\n\trate_limit: {unit: second, requests_per_unit: 1}\n",
			"f.yaml:4: bad YAML: found a tab character that violates indentation"},
		{"mis-indented rate_limit", "domain: d\ndescriptors:\n  - key: a\n   rate_limit: {unit: second, requests_per_unit: 1}\n",
			"f.yaml:4: bad YAML: did not find expected '-' indicator"},
		{"mis-indented far down a list", "domain: d\ndescriptors:\n" + strings.Repeat("  - key: a\n    value: v\n", 50) + "   rate_limit: {unit: second, requests_per_unit: 1}\n",
			"f.yaml:103: bad YAML: did not find expected '-' indicator"},
		{"outdented key", "domain: d\ndescriptors:\n  - key: a\n rate_limit: {unit: second, requests_per_unit: 1}\n",
			"f.yaml:4: bad YAML: did not find expected key"},
		{"too deep", "domain: d\ndescriptors:\n  - key: a\n      rate_limit: {unit: second, requests_per_unit: 1}\n",
			"f.yaml:4: bad YAML: mapping values are not allowed in this context"},
		{"unknown anchor", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: *nope\n",
			"f.yaml:4: bad YAML: unknown anchor 'nope' referenced"},
		{"second document", "domain: d\n---\ndomain: e\ndescriptors:\n  - key: a\n\trate_limit: {}\n",
			"f.yaml:6: bad YAML: found a tab character that violates indentation"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := rules.Parse("f.yaml", []byte(tc.yaml))
			require.Error(t, err)
			assert.Equal(t, tc.want, err.Error())
		})
	}
}

// A domain configured twice names the flag that merges, not a Go field.
func TestDuplicateDomainNamesTheFlag(t *testing.T) {
	_, err := rules.Parse("f.yaml", []byte("domain: d\n---\ndomain: d\n"))
	require.Error(t, err)
	assert.Equal(t, `f.yaml:3: domain: "d" is configured twice (first in f.yaml); -merge-domain-config merges a domain's files`, err.Error())
	assert.NotContains(t, err.Error(), "MergeDomains")
}

// Past its parse budget, the search for the line at fault gives up: the
// error keeps the decoder's line and says the fault is further down.
func TestYAMLErrorLineBudget(t *testing.T) {
	yaml := "domain: d\ndescriptors:\n" + strings.Repeat("  - key: a\n    value: v\n", 500) + "   rate_limit: {unit: second, requests_per_unit: 1}\n"
	_, err := rules.Parse("f.yaml", []byte(yaml))
	require.Error(t, err)
	assert.Equal(t, "f.yaml:1003: bad YAML: did not find expected '-' indicator", err.Error())

	defer rules.SetLineSearchBudget(len(yaml) / 2)()
	_, err = rules.Parse("f.yaml", []byte(yaml))
	require.Error(t, err)
	assert.Equal(t, "f.yaml:2: bad YAML: did not find expected '-' indicator (at this line or further down: the file is too large to find the exact line quickly)", err.Error())
}
