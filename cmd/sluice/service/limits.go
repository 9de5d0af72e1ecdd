// Package service is the HTTP global rate-limit service behind `sluice serve`:
// handlers for /allow, /stats, /healthz and /metrics over a store.Store, the
// -limits syntax, and the Prometheus metrics; and Envoy's RateLimitService
// over gRPC (RegisterRateLimitService) with envoyproxy/ratelimit-style rules
// (package rules), on the same decision path.
package service

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/sluice-go/sluice/internal/limitresponse"
	"github.com/sluice-go/sluice/store"
)

// MaxKeyLen is the longest key, in bytes, that /allow accepts and -limits
// may name.
const MaxKeyLen = 256

// ParseLimits parses the -limits flag: comma-separated entries KEY=RATE:BURST
// (or KEY=RATE, burst then max(1, ⌈RATE⌉)), for example
// "tenant-a=100:200,tenant-b=5:5". RATE is tokens per second and may be
// fractional; BURST is a whole number of tokens. Spaces around entries and
// fields are ignored; an empty string means no overrides. Each error names the
// entry at fault. Keys may contain '=' (the last '=' splits) but not ','.
func ParseLimits(s string) (map[string]store.Policy, error) {
	limits := make(map[string]store.Policy)
	if strings.TrimSpace(s) == "" {
		return limits, nil
	}
	for i, entry := range strings.Split(s, ",") {
		p, key, err := parseLimit(strings.TrimSpace(entry), i)
		if err != nil {
			return nil, fmt.Errorf("-limits entry %d %q: %w", i+1, entry, err)
		}
		if _, dup := limits[key]; dup {
			return nil, fmt.Errorf("-limits entry %d %q: key %q is already limited by an earlier entry", i+1, entry, key)
		}
		limits[key] = p
	}
	return limits, nil
}

func parseLimit(entry string, i int) (store.Policy, string, error) {
	if entry == "" {
		return store.Policy{}, "", fmt.Errorf("empty entry (a stray comma?)")
	}
	eq := strings.LastIndexByte(entry, '=')
	if eq < 0 {
		return store.Policy{}, "", fmt.Errorf("want KEY=RATE:BURST")
	}
	key, spec := strings.TrimSpace(entry[:eq]), strings.TrimSpace(entry[eq+1:])
	switch {
	case key == "":
		return store.Policy{}, "", fmt.Errorf("empty key")
	case len(key) > MaxKeyLen:
		return store.Policy{}, "", fmt.Errorf("key is %d bytes, over the %d-byte maximum", len(key), MaxKeyLen)
	}
	rateS, burstS, hasBurst := strings.Cut(spec, ":")
	rate, err := strconv.ParseFloat(strings.TrimSpace(rateS), 64)
	if errors.Is(err, strconv.ErrRange) { // a number past what a float64 holds: ±Inf
		return store.Policy{}, "", fmt.Errorf("rate %q is out of range (at most 1e9 tokens per second)", rateS)
	}
	if err != nil {
		return store.Policy{}, "", fmt.Errorf("rate %q is not a number", rateS)
	}
	var burst int64
	if hasBurst {
		burst, err = strconv.ParseInt(strings.TrimSpace(burstS), 10, 64)
		if errors.Is(err, strconv.ErrRange) {
			return store.Policy{}, "", fmt.Errorf("burst %q is out of range (a whole number past int64)", burstS)
		}
		if err != nil {
			return store.Policy{}, "", fmt.Errorf("burst %q is not a whole number", burstS)
		}
	} else if rate > 0 && rate < 1e9 {
		burst = max(1, int64(math.Ceil(rate)))
	}
	p := store.Policy{Name: policyName(key, i), Rate: rate, Burst: burst}
	if err := p.Validate(); err != nil {
		return store.Policy{}, "", err
	}
	return p, key, nil
}

// policyName is the name a per-key policy carries in RateLimit-Policy headers
// and metric labels: the key itself when it is a valid policy name
// (limitresponse.CheckName, the rule httplimit applies too), else "limit-N"
// after its place in -limits.
func policyName(key string, i int) string {
	if limitresponse.CheckName(key) != nil {
		return "limit-" + strconv.Itoa(i+1)
	}
	return key
}
