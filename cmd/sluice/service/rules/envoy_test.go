package rules_test

// envoyproxy/ratelimit's configuration test suite (test/config), checked
// against this package as a user replacing that service would: the same
// shapes of file (testdata/envoy, in our words), the same descriptors, the
// same answer: which rule, or none; which file is refused. Statistics names
// (detailed_metric, value_to_metric) have no counterpart here; where
// envoyproxy/ratelimit checks that values share a statistic under
// share_threshold, these check that they share a bucket.

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
)

func envoyFile(name string) string { return filepath.Join("testdata", "envoy", name) }

func loadEnvoy(t *testing.T, opt rules.Options, names ...string) (*rules.Config, error) {
	t.Helper()
	paths := make([]string, len(names))
	for i, n := range names {
		paths[i] = envoyFile(n)
	}
	return rules.LoadAll(paths, opt)
}

func mustLoadEnvoy(t *testing.T, names ...string) *rules.Config {
	t.Helper()
	c, err := loadEnvoy(t, rules.Options{}, names...)
	require.NoError(t, err)
	return c
}

// want is the rule a descriptor should match: nil for none.
type want struct {
	rpu       uint32
	unit      rules.Unit
	unlimited bool
	name      string // rate_limit.name; "" for an unnamed rule
}

func checkMatch(t *testing.T, c *rules.Config, domain string, entries []rules.KV, w *want) *rules.Rule {
	t.Helper()
	r := rules.Match(c, domain, entries)
	if w == nil {
		assert.Nil(t, r, "%v", entries)
		return nil
	}
	if !assert.NotNil(t, r, "%v", entries) {
		return nil
	}
	assert.Equal(t, w.rpu, r.RequestsPerUnit, "%v", entries)
	assert.Equal(t, w.unit, r.Unit, "%v", entries)
	assert.Equal(t, w.unlimited, r.Unlimited, "%v", entries)
	assert.Equal(t, w.name != "", r.Named, "%v", entries)
	if w.name != "" {
		assert.Equal(t, w.name, r.Name, "%v", entries)
	}
	return r
}

func TestEnvoyBasicConfig(t *testing.T) {
	c := mustLoadEnvoy(t, "basic.yaml")
	assert.Equal(t, []string{"test-domain"}, c.Domains())
	assert.False(t, c.HasDomain("foo_domain"))
	assert.True(t, c.HasDomain("test-domain"))
	for _, tc := range []struct {
		domain  string
		entries []rules.KV
		want    *want
	}{
		{"foo_domain", nil, nil},
		{"test-domain", nil, nil},
		{"test-domain", kv("key1", "something"), nil},
		{"test-domain", kv("key1", "value1"), nil},                        // a node without a limit
		{"test-domain", kv("key2", "value2", "subkey", "subvalue"), nil},  // deeper than the rule
		{"test-domain", kv("key5", "value5", "subkey5", "subvalue"), nil}, // no backtracking to key5's own limit
		{"test-domain", kv("key1", "value1", "subkey1", "something"), &want{rpu: 5, unit: rules.Second}},
		{"test-domain", kv("key1", "value1", "subkey1", "subvalue1"), &want{rpu: 10, unit: rules.Second}},
		{"test-domain", kv("key2", "something"), &want{rpu: 20, unit: rules.Minute}},
		{"test-domain", kv("key2", "value2"), &want{rpu: 30, unit: rules.Minute}},
		{"test-domain", kv("key2", "value3"), nil}, // allow-listed
		{"test-domain", kv("key3", "foo"), &want{rpu: 1, unit: rules.Hour}},
		{"test-domain", kv("key4", "foo"), &want{rpu: 1, unit: rules.Day, name: "key4_rate_limit"}},
		{"test-domain", kv("key5", "value5"), &want{rpu: 15, unit: rules.Day}},
		{"test-domain", kv("key5", "value5", "subkey5", "subvalue5"), &want{rpu: 25, unit: rules.Day}},
		{"test-domain", kv("key6", "foo"), &want{unlimited: true}},
		{"test-domain", kv("key7", "unspecified_value"), &want{rpu: 70, unit: rules.Minute}},
		{"test-domain", kv("key7", "another_value"), &want{rpu: 70, unit: rules.Minute}},
	} {
		checkMatch(t, c, tc.domain, tc.entries, tc.want)
	}
	// Two values of a key-only rule: one rule, a bucket each.
	a, b := kv("key7", "unspecified_value"), kv("key7", "another_value")
	assert.NotEqual(t, rules.BucketKey(rules.RLS, rules.Match(c, "test-domain", a), a),
		rules.BucketKey(rules.RLS, rules.Match(c, "test-domain", b), b))
}

func TestEnvoyDomainMerge(t *testing.T) {
	c, err := loadEnvoy(t, rules.Options{MergeDomains: true}, "merge_a.yaml", "merge_b.yaml")
	require.NoError(t, err)
	checkMatch(t, c, "foo_domain", nil, nil)
	checkMatch(t, c, "test-domain", nil, nil)
	r := checkMatch(t, c, "test-domain", kv("key1", "value1"), &want{rpu: 10, unit: rules.Minute})
	assert.Equal(t, envoyFile("merge_a.yaml"), r.File)
	r = checkMatch(t, c, "test-domain", kv("key2", "value2"), &want{rpu: 20, unit: rules.Minute})
	assert.Equal(t, envoyFile("merge_b.yaml"), r.File)
	assert.Equal(t, []string{envoyFile("merge_a.yaml"), envoyFile("merge_b.yaml")}, c.Files)

	// Without merging, the second file of a domain is refused, naming both.
	_, err = loadEnvoy(t, rules.Options{}, "merge_a.yaml", "merge_b.yaml")
	require.Error(t, err)
	assert.Contains(t, err.Error(), envoyFile("merge_b.yaml")+`:2: domain: "test-domain" is configured twice (first in `+envoyFile("merge_a.yaml"))
}

func TestEnvoyDuplicateKeyDomainMerge(t *testing.T) {
	_, err := loadEnvoy(t, rules.Options{MergeDomains: true}, "merge_a.yaml", "merge_a.yaml")
	require.Error(t, err)
	assert.Contains(t, err.Error(), envoyFile("merge_a.yaml")+`:4: descriptors[0]: key "key1" with value "value1" is configured twice`)
}

// Every file envoyproxy/ratelimit refuses is refused, the error naming it.
func TestEnvoyRefusedFiles(t *testing.T) {
	for _, tc := range []struct {
		files []string
		want  string
	}{
		{[]string{"empty_domain.yaml"}, `empty_domain.yaml:1: domain: missing`},
		{[]string{"basic.yaml", "duplicate_domain.yaml"}, `duplicate_domain.yaml:2: domain: "test-domain" is configured twice`},
		{[]string{"empty_key.yaml"}, `empty_key.yaml:3: descriptors[0].key: missing`},
		{[]string{"duplicate_key.yaml"}, `duplicate_key.yaml:5: descriptors[1]: key "key1" with value "value1" is configured twice`},
		{[]string{"bad_limit_unit.yaml"}, `bad_limit_unit.yaml:5: descriptors[0].rate_limit.unit: "foo" is not a unit`},
		{[]string{"replaces_self.yaml"}, `replaces_self.yaml:8: descriptors[0].descriptors[0].rate_limit.replaces[0].name: "self" is this rule's own name`},
		{[]string{"replaces_empty.yaml"}, `replaces_empty.yaml:10: descriptors[0].descriptors[0].rate_limit.replaces[0].name: empty`},
		{[]string{"bad_yaml.yaml"}, `bad_yaml.yaml:2: bad YAML: found unexpected end of stream`},
		{[]string{"misspelled_key.yaml"}, `misspelled_key.yaml:5: descriptors[0].ratelimit: unknown field`},
		{[]string{"misspelled_key2.yaml"}, `misspelled_key2.yaml:5: descriptors[0].rate_limit.requestsperunit: unknown field`},
		{[]string{"non_string_key.yaml"}, `non_string_key.yaml:1: 0.25: unknown field`},
		{[]string{"non_map_list.yaml"}, `non_map_list.yaml:2: descriptors[0]: want a mapping`},
		{[]string{"unlimited_with_unit.yaml"}, `unlimited_with_unit.yaml:4: descriptors[0].rate_limit.unit: must not be given with unlimited: true`},
	} {
		_, err := loadEnvoy(t, rules.Options{}, tc.files...)
		var re *rules.Error
		if assert.ErrorAs(t, err, &re, "%v", tc.files) {
			assert.Contains(t, err.Error(), envoyFile(tc.want), "%v", tc.files)
		}
	}
}

func TestEnvoyShadowModeConfig(t *testing.T) {
	c := mustLoadEnvoy(t, "shadow_mode.yaml")
	for _, tc := range []struct {
		entries []rules.KV
		rpu     uint32
		shadow  bool
	}{
		{kv("key1", "value1", "subkey1", "something"), 5, false},
		{kv("key1", "value1", "subkey1", "subvalue1"), 10, true},
		{kv("key2", "something"), 20, true},
		{kv("key2", "value2"), 30, false},
	} {
		r := rules.Match(c, "test-domain", tc.entries)
		require.NotNil(t, r, "%v", tc.entries)
		assert.Equal(t, tc.rpu, r.RequestsPerUnit, "%v", tc.entries)
		assert.Equal(t, tc.shadow, r.Shadow, "%v", tc.entries)
	}
}

func TestEnvoyWildcardConfig(t *testing.T) {
	c := mustLoadEnvoy(t, "wildcard.yaml")
	same := func(a, b []rules.KV) {
		t.Helper()
		ra, rb := rules.Match(c, "test-domain", a), rules.Match(c, "test-domain", b)
		require.NotNil(t, ra, "%v", a)
		assert.Same(t, ra, rb, "%v and %v", a, b)
	}
	same(kv("noVal", "foo1"), kv("noVal", "foo2"))
	same(kv("wild", "foo1"), kv("wild", "foo2"))
	checkMatch(t, c, "test-domain", kv("nestedWild", "val1", "wild", "goo2"), &want{rpu: 20, unit: rules.Minute})
	checkMatch(t, c, "test-domain", kv("wild", "bar"), nil)
	checkMatch(t, c, "test-domain", kv("noWild", "foo1"), nil) // a value without '*' is exact
	same(kv("midWild", "barab"), kv("midWild", "bar123b"))
	checkMatch(t, c, "test-domain", kv("midWild", "barb"), &want{rpu: 20, unit: rules.Minute}) // '*' matches nothing too
	checkMatch(t, c, "test-domain", kv("midWild", "bara"), nil)
	checkMatch(t, c, "test-domain", kv("midWild", "xbarb"), nil)
	same(kv("multiWild", "foo123bar456baz"), kv("multiWild", "foobarbaz"))
	checkMatch(t, c, "test-domain", kv("multiWild", "foo123baz"), nil)
	checkMatch(t, c, "test-domain", kv("multiWild", "bar456baz"), nil)
	// Without share_threshold each value has its own bucket.
	a, b := kv("wild", "foo1"), kv("wild", "foo2")
	assert.NotEqual(t, rules.BucketKey(rules.RLS, rules.Match(c, "test-domain", a), a),
		rules.BucketKey(rules.RLS, rules.Match(c, "test-domain", b), b))
}

func TestEnvoyShareThreshold(t *testing.T) {
	c := mustLoadEnvoy(t, "share_threshold.yaml")
	// shared checks that every descriptor matches a rule of rpu and that all
	// count against one bucket.
	shared := func(rpu uint32, ds ...[]rules.KV) {
		t.Helper()
		var key string
		for i, d := range ds {
			r := rules.Match(c, "test-domain", d)
			if !assert.NotNil(t, r, "%v", d) {
				continue
			}
			assert.Equal(t, rpu, r.RequestsPerUnit, "%v", d)
			k := rules.BucketKey(rules.RLS, r, d)
			if i == 0 {
				key = k
			}
			assert.Equal(t, key, k, "%v", d)
		}
	}
	shared(100, kv("files", "files/a.pdf"), kv("files", "files/b.csv"), kv("files", "files/c.txt"))
	shared(60, kv("route", "api/v1", "method", "GET"), kv("route", "api/v2", "method", "GET"))
	shared(80, kv("service", "svc/user", "endpoint", "get"), kv("service", "svc/order", "endpoint", "get"))
	shared(200, kv("nested", "parent", "files", "nested/file1.txt"), kv("nested", "parent", "files", "nested/file2.txt"))
	shared(300, kv("files", "top/file1.txt", "files", "nested/file1.txt"), kv("files", "top/x", "files", "nested/y"))
	shared(150, kv("user", "user/alice", "resource", "res/file1", "action", "read"),
		kv("user", "user/bob", "resource", "res/file2", "action", "read"))
	shared(100, kv("file", "test2"), kv("file", "test23"), kv("file", "test123"))
	shared(100, kv("midpath", "/api/v1"), kv("midpath", "/api-beta-v1"), kv("midpath", "/apiXYZv1"))
	shared(50, kv("multiroute", "svcAepBrpc"), kv("multiroute", "svcXXXepYYYrpc"), kv("multiroute", "svceprpc"))
	shared(80, kv("midroute", "/api/v2"), kv("midroute", "/api-beta-v2"))
	shared(60, kv("tenant", "t1prod", "resource", "resAv2"), kv("tenant", "t99prod", "resource", "resBBBv2"))

	// Shared at the top level, not below: one bucket per file/* value.
	p1, p2 := kv("path", "path/foo", "file", "file/doc1", "type", "pdf"), kv("path", "path/bar", "file", "file/doc1", "type", "pdf")
	p3 := kv("path", "path/foo", "file", "file/doc2", "type", "pdf")
	r := checkMatch(t, c, "test-domain", p1, &want{rpu: 120, unit: rules.Minute})
	assert.Equal(t, rules.BucketKey(rules.RLS, r, p1), rules.BucketKey(rules.RLS, r, p2))
	assert.NotEqual(t, rules.BucketKey(rules.RLS, r, p1), rules.BucketKey(rules.RLS, r, p3))

	// An exact value wins over the shared pattern, with a bucket of its own.
	checkMatch(t, c, "test-domain", kv("file", "test1"), &want{rpu: 50, unit: rules.Minute})
	checkMatch(t, c, "test-domain", kv("midpath", "/api/v2"), nil)
	checkMatch(t, c, "test-domain", kv("multiroute", "svcABCrpc"), nil)
}

// metadata is accepted and carried on the rule.
func TestEnvoyMetadata(t *testing.T) {
	c := mustLoadEnvoy(t, "metadata.yaml")
	r := checkMatch(t, c, "test-domain", kv("key1", "value1", "subkey1", "x"), &want{rpu: 5, unit: rules.Second})
	assert.Equal(t, map[string]any{"name": "service_1"}, r.Metadata)
	r = checkMatch(t, c, "test-domain", kv("key1", "value1", "subkey1", "subvalue1"), &want{rpu: 10, unit: rules.Second})
	assert.Nil(t, r.Metadata)
	r = checkMatch(t, c, "test-domain", kv("key2", "x"), &want{rpu: 20, unit: rules.Minute})
	assert.Equal(t, map[string]any{"service_with_quota": map[string]any{"name": "service_2"}}, r.Metadata)
}

// A directory is every *.yaml and *.yml in it; this one holds good and bad
// files, so loading it whole is refused naming the first bad one.
func TestEnvoyDirectory(t *testing.T) {
	_, err := rules.LoadAll([]string{filepath.Join("testdata", "envoy")}, rules.Options{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), envoyFile("bad_limit_unit.yaml"))

	dir := t.TempDir()
	for _, f := range []string{"basic.yaml", "wildcard.yaml"} {
		data, err := os.ReadFile(envoyFile(f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), data, 0o600))
	}
	_, err = rules.LoadAll([]string{dir}, rules.Options{})
	assert.ErrorContains(t, err, filepath.Join(dir, "wildcard.yaml")+`:2: domain: "test-domain" is configured twice (first in `+filepath.Join(dir, "basic.yaml"))
}

// detailed_metric and value_to_metric change statistics names only: the
// file loads and every descriptor finds the limit it would without them.
func TestEnvoyDetailedMetricAndValueToMetric(t *testing.T) {
	c := mustLoadEnvoy(t, "detailed_metric.yaml")
	for _, tc := range []struct {
		entries []rules.KV
		want    *want
	}{
		{kv("key_1", "value-for-key-1"), &want{rpu: 500, unit: rules.Minute}},
		{kv("key_1", "some-value-for-key-1"), &want{rpu: 500, unit: rules.Minute}},
		{kv("key_2", "key-2-value"), &want{rpu: 5000, unit: rules.Minute}},
		{kv("key_2", "key-2-value", "key_3", "requested-key3-value"), &want{rpu: 5, unit: rules.Minute}},
		{kv("key_2", "key-2-value", "key_3", "other"), nil}, // key_3 alone has no limit
		{kv("key_2", "specific-id"), &want{rpu: 50000, unit: rules.Minute}},
		{kv("key_2", "specific-id", "key_3", "requested-key3-value"), &want{rpu: 100, unit: rules.Minute}},
		{kv("route", "draw", "http_method", "GET", "subject_id", "123"), &want{rpu: 60, unit: rules.Second}},
		{kv("route", "", "http_method", "", "subject_id", "123"), &want{rpu: 60, unit: rules.Second}},
		{kv("route", "draw", "http_method", "GET"), nil},
	} {
		checkMatch(t, c, "nested", tc.entries, tc.want)
	}
}
