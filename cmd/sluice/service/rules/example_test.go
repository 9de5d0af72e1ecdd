package rules_test

import (
	"fmt"

	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
)

// Reading a rules file and finding the rule of a descriptor, with the bucket
// it counts against and the GCRA policy it decides with.
func Example() {
	c, err := rules.Parse("limits.yaml", []byte(`
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: user
    value: batch-job
    rate_limit: {unit: second, requests_per_unit: 200}
`))
	if err != nil {
		panic(err)
	}
	for _, user := range []string{"alice", "batch-job"} {
		d := []rules.KV{{Key: "user", Value: user}}
		r := rules.Match(c, "api", d)
		p, _ := r.Policy()
		fmt.Printf("%s: rule %s (line %d), %v/s, burst %d, bucket %s\n",
			user, r.Name, r.Line, p.Rate, p.Burst, rules.BucketKey(rules.RLS, r, d))
	}
	_, err = rules.Parse("bad.yaml", []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minutes, requests_per_unit: 60}\n"))
	fmt.Println(err)
	// Output:
	// alice: rule api.user (line 4), 1/s, burst 60, bucket rls:api|user=alice|60/minute
	// batch-job: rule api.user_batch-job (line 6), 200/s, burst 200, bucket rls:api|user=batch-job|200/second
	// bad.yaml:4: descriptors[0].rate_limit.unit: "minutes" is not a unit (want second, minute, hour, day, week or month)
}
