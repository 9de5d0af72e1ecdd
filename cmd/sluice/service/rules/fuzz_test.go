package rules_test

import (
	"errors"
	"testing"

	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
)

// FuzzParse: no input panics Parse; every refusal is an *Error; every
// accepted file's rules match themselves.
func FuzzParse(f *testing.F) {
	f.Add([]byte(examples))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    value: a*b*c\n    rate_limit: {unit: second, requests_per_unit: 1}\n"))
	f.Add([]byte("domain: d\ndescriptors: &x\n  - key: k\n    descriptors: *x\n"))
	f.Add([]byte("- 1\n- 2\n"))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: a\n    descriptors: &a\n      - key: b\n  - key: c\n    descriptors:\n      - {key: x, descriptors: *a}\n      - {key: y, descriptors: *a}\n"))
	f.Add([]byte("domain: [d]\n"))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    quota_mode: true\n    metadata: {a: [1, {b: c}], 2: null}\n    rate_limit: {name: n, replaces: [{name: m}], unit: minute, unit_multiplier: 5, requests_per_unit: 3}\n"))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    metadata: &m {a: &l [*m]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := rules.Parse("fuzz.yaml", data)
		if err != nil {
			var re *rules.Error
			if !errors.As(err, &re) {
				t.Fatalf("error of type %T: %v", err, err)
			}
			return
		}
		for i, r := range c.Rules {
			if r.Index != i {
				t.Fatalf("rule %d has Index %d", i, r.Index)
			}
			entries := make([]rules.KV, len(r.Path))
			for j, l := range r.Path {
				entries[j] = rules.KV{Key: l.Key, Value: l.Value}
			}
			_ = rules.BucketKey(rules.RLS, r, entries)
			if m := rules.Match(c, r.Domain, entries); m == nil {
				t.Fatalf("rule %s does not match its own path", r.Name)
			}
		}
	})
}
