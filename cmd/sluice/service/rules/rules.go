// Package rules reads rate-limit rules in the YAML format of
// envoyproxy/ratelimit and matches Envoy rate-limit descriptors against them.
//
// A file holds one or more YAML documents, each naming a domain and a tree of
// descriptors:
//
//	domain: messaging
//	descriptors:
//	  - key: message_type
//	    value: marketing
//	    descriptors:
//	      - key: to_number
//	        rate_limit: {unit: day, requests_per_unit: 5}
//	  - key: to_number
//	    rate_limit: {unit: day, requests_per_unit: 100}
//
// A request descriptor is a list of (key, value) entries. Its i-th entry is
// looked up among the i-th level of the tree: first a rule with that key and
// that exact value, then one whose value is a pattern with '*' wildcards
// (the first in file order), then one with the key and no value (it matches
// every value). The descriptor matches the node its last entry reaches, if
// that node has a rate_limit; a descriptor with more or fewer entries than
// the path to a rule does not match it. There is no backtracking: once an
// entry matched by value, a failure further down does not retry the
// key-only branch (as in envoyproxy/ratelimit).
//
// Several files (and directories of them) load into one Config with
// LoadAll; a domain in two files is refused unless Options.MergeDomains.
//
// A Config is immutable once loaded and safe for concurrent use.
package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-go/sluice/store"
)

// Unit is the period of a rule's requests_per_unit, as written in the file.
type Unit string

// The units envoyproxy/ratelimit knows. Year is refused at load ("year is
// not supported; at most month"): a bucket that refills over a year is past
// MaxPeriod.
const (
	Second Unit = "second"
	Minute Unit = "minute"
	Hour   Unit = "hour"
	Day    Unit = "day"
	Week   Unit = "week"
	Month  Unit = "month" // 30 days, as envoyproxy/ratelimit counts it
	Year   Unit = "year"  // 365 days
)

var unitLength = map[Unit]time.Duration{
	Second: time.Second,
	Minute: time.Minute,
	Hour:   time.Hour,
	Day:    24 * time.Hour,
	Week:   7 * 24 * time.Hour,
	Month:  30 * 24 * time.Hour,
	Year:   365 * 24 * time.Hour,
}

// Duration is the length of one unit.
func (u Unit) Duration() time.Duration { return unitLength[u] }

// MaxPeriod is the longest period a rule or an Envoy limit override may
// have: its unit times its unit_multiplier, at most 52 days. Why 52 days:
// the stores keep a bucket's refill time (burst × emission interval, about
// one period) below store.MaxTolerance, 2⁵² ns (52 days and 3 hours), so
// that the Redis store's Lua doubles stay exact; every period of at most
// 52 days fits under it whatever requests_per_unit, so the bound a user
// reads is a round number of days that the stores never tighten.
const MaxPeriod = 52 * 24 * time.Hour

// ErrPeriodTooLong is the error (wrapped) of a period past MaxPeriod.
var ErrPeriodTooLong = errors.New("past the 52-day maximum period")

// PeriodOf is the period of mult units (a unit_multiplier of 0 counts as
// 1): unit × mult, checked before it is multiplied, so a product that
// would overflow int64 (60 s × 307,445,735 wraps to 26 s) is refused like
// any other period past MaxPeriod, with an error wrapping
// ErrPeriodTooLong. An unknown unit is an error too.
func PeriodOf(u Unit, mult uint32) (time.Duration, error) {
	d := u.Duration()
	if d == 0 {
		return 0, fmt.Errorf("%q is not a unit", string(u))
	}
	m := time.Duration(max(mult, 1))
	if m > MaxPeriod/d {
		if u == Day {
			return 0, fmt.Errorf("%d %s is %w", m, u, ErrPeriodTooLong)
		}
		// Why float days: the product itself may not fit a Duration.
		return 0, fmt.Errorf("%d %s is %w (%.0f days)", m, u, ErrPeriodTooLong, float64(m)*d.Hours()/24)
	}
	return d * m, nil
}

// Level is one step of the path from a domain to a rule.
type Level struct {
	Key string
	// Value is the value the entry must have; "" matches every value; a
	// value with '*' is a pattern in which each '*' matches any run of bytes.
	Value string
	// Share makes every value a pattern matches count against one bucket
	// (share_threshold); otherwise each distinct value has its own.
	Share bool
}

// Rule is a descriptor with a rate_limit block.
type Rule struct {
	Domain string
	Path   []Level // from the top level down to this rule
	// Name labels the rule in metrics: rate_limit.name when given, else
	// the domain and path ("messaging.message_type_marketing.to_number").
	Name string
	// Named says Name is the file's rate_limit.name. Only a named rule
	// reports its name in Envoy's current_limit and can be replaced.
	Named           bool
	RequestsPerUnit uint32
	Unit            Unit // "" when Unlimited
	// UnitMultiplier stretches the period to UnitMultiplier units (10 per
	// 5 minutes); 0 and 1 both mean one unit.
	UnitMultiplier uint32
	Unlimited      bool // always allowed, never counted
	Shadow         bool // shadow_mode: decided and counted, never denied
	// QuotaMode (quota_mode) lets the rule's OVER_LIMIT leave the request
	// as a whole OK unless every quota-mode descriptor of it is over.
	QuotaMode bool
	// Replaces names the rules (by rate_limit.name) whose limits this rule,
	// when a request matches it, removes from the request's answer.
	Replaces []string
	// Metadata is the descriptor's metadata mapping, as written; it has no
	// effect on decisions. Nil when the file gives none. Rules whose
	// metadata is (or holds) the same alias share its value: read it,
	// never write it (a Config is immutable).
	Metadata map[string]any
	File     string // the file the rule is read from
	Line     int    // where the rule starts in its file
	Index    int    // position in Config.Rules
	// Override marks a rule made for an Envoy limit override rather than
	// read from a file: its buckets never share a key with a file's rule
	// (see BucketKey).
	Override bool
}

// Policy is the GCRA policy of a limited rule: RequestsPerUnit tokens refill
// evenly over one Unit (rate = requests_per_unit / unit), in a bucket that
// holds RequestsPerUnit (burst). ok is false for an unlimited rule and for
// requests_per_unit 0, which denies everything and needs no bucket.
func (r *Rule) Policy() (p store.Policy, ok bool) {
	if r.Unlimited || r.RequestsPerUnit == 0 {
		return store.Policy{}, false
	}
	n := int64(r.RequestsPerUnit)
	return store.Policy{Name: r.Name, Rate: float64(n) / r.Period().Seconds(), Burst: n}, true
}

// Period is the span requests_per_unit refill over: the unit times
// UnitMultiplier. Zero for an unlimited rule. A rule a file or an override
// yields has a period of at most MaxPeriod (see PeriodOf); for one built by
// hand past that, Period saturates at the largest Duration rather than
// wrap, so its Policy fails store.Policy.Validate.
func (r *Rule) Period() time.Duration {
	d, m := r.Unit.Duration(), time.Duration(max(r.UnitMultiplier, 1))
	if d != 0 && m > math.MaxInt64/d {
		return math.MaxInt64
	}
	return d * m
}

// per is the period as written: "minute", or "5 minute" with a multiplier.
func (r *Rule) per() string {
	if r.UnitMultiplier > 1 {
		return strconv.FormatUint(uint64(r.UnitMultiplier), 10) + " " + string(r.Unit)
	}
	return string(r.Unit)
}

// Config is a set of loaded rules files.
type Config struct {
	// File is the first file read, Files all of them in the order read.
	File  string
	Files []string
	Rules []*Rule
	// Warnings are what the files say that loads but likely is not meant:
	// rules that replace one another in a cycle (see ParseAll). The service
	// logs them at each load.
	Warnings []*Error
	domains  map[string]level
}

// HasDomain reports whether the rules configure domain. A nil Config has
// no domain.
func (c *Config) HasDomain(domain string) bool {
	if c == nil {
		return false
	}
	_, ok := c.domains[domain]
	return ok
}

// Domains reports the domains the file configures, in file order.
func (c *Config) Domains() []string {
	var ds []string
	seen := map[string]bool{}
	for _, r := range c.Rules {
		if !seen[r.Domain] {
			seen[r.Domain] = true
			ds = append(ds, r.Domain)
		}
	}
	return ds
}

// level is the descriptors of one nesting level, by key.
type level map[string]*keyed

// keyed is every descriptor of one level with one key.
type keyed struct {
	exact map[string]*node // by value
	wild  []wildcard       // in file order
	any   *node            // no value
}

type wildcard struct {
	parts []string // the pattern split at '*'
	n     *node
}

type node struct {
	rule     *Rule // nil for a placeholder with only nested descriptors
	children level
}

func (w wildcard) match(v string) bool {
	first, last := w.parts[0], w.parts[len(w.parts)-1]
	if len(v) < len(first)+len(last) || !strings.HasPrefix(v, first) || !strings.HasSuffix(v, last) {
		return false
	}
	v = v[len(first) : len(v)-len(last)]
	for _, p := range w.parts[1 : len(w.parts)-1] {
		i := strings.Index(v, p)
		if i < 0 {
			return false
		}
		v = v[i+len(p):]
	}
	return true
}

// Entry is one (key, value) of a descriptor. The Envoy generated type
// (*ratelimitv3.RateLimitDescriptor_Entry) satisfies it.
type Entry interface {
	GetKey() string
	GetValue() string
}

// KV is a plain Entry.
type KV struct{ Key, Value string }

// GetKey returns kv.Key.
func (kv KV) GetKey() string { return kv.Key }

// GetValue returns kv.Value.
func (kv KV) GetValue() string { return kv.Value }

// Match returns the rule for a descriptor of domain, or nil when none
// applies (an unknown domain, an unmatched entry, or a path that ends on a
// node without rate_limit). A nil Config matches nothing. It does not
// allocate.
func Match[E Entry](c *Config, domain string, entries []E) *Rule {
	if c == nil || len(entries) == 0 {
		return nil
	}
	cur, ok := c.domains[domain]
	if !ok {
		return nil
	}
	var n *node
	for _, e := range entries {
		k := cur[e.GetKey()]
		if k == nil {
			return nil
		}
		v := e.GetValue()
		n = k.exact[v]
		if n == nil {
			for _, w := range k.wild {
				if w.match(v) {
					n = w.n
					break
				}
			}
		}
		if n == nil {
			n = k.any
		}
		if n == nil {
			return nil
		}
		cur = n.children
	}
	return n.rule
}

// MaxBucketKeyLen is the longest key BucketKey returns: longer keys are
// replaced by a digest so every store (the shm store holds 256 bytes) can
// keep them.
const MaxBucketKeyLen = 256

// API names the front end a bucket key is made for. The buckets of
// different APIs never share a key, even for the same domain and rule.
type API string

// The APIs of sluice serve.
const (
	RLS   API = "rls"   // Envoy's ShouldRateLimit (gRPC)
	Allow API = "allow" // the HTTP /allow, for keys that match a rule of its domain
)

// BucketKey is the store key of the bucket a descriptor matched by r counts
// against when api asks: the API, the domain, each entry's key and value
// (a shared wildcard's pattern instead of the value), and r's limit, as in
// "rls:edge|remote_address=198.51.100.7|20/second" (with a unit_multiplier
// of 5, "20/5second"). Two descriptors share a
// bucket exactly when their keys are equal; a rule whose limit changes on
// reload starts a new bucket (full), one whose limit stays keeps its state.
//
// The encoding is injective: '%', '|', '=' and '*' in the domain, keys and
// values are percent-encoded (a shared pattern keeps its '*'), so no
// descriptor of one API, domain or rule can produce the key of another. An
// Override rule's limit is written "override:N/unit", so its buckets are
// apart from those of a rule with the same limit. Keys of MaxBucketKeyLen
// bytes and more are replaced by the API, '#' and the SHA-256 digest of the
// whole key in hex ("rls#…", 68 bytes).
func BucketKey[E Entry](api API, r *Rule, entries []E) string {
	var b strings.Builder
	b.Grow(64)
	b.WriteString(string(api))
	b.WriteByte(':')
	escape(&b, r.Domain, "%|=*")
	for i, e := range entries {
		b.WriteByte('|')
		escape(&b, e.GetKey(), "%|=*")
		b.WriteByte('=')
		if i < len(r.Path) && r.Path[i].Share {
			escape(&b, r.Path[i].Value, "%|=")
		} else {
			escape(&b, e.GetValue(), "%|=*")
		}
	}
	b.WriteByte('|')
	if r.Override {
		b.WriteString("override:")
	}
	b.WriteString(strconv.FormatUint(uint64(r.RequestsPerUnit), 10))
	b.WriteByte('/')
	if r.UnitMultiplier > 1 {
		b.WriteString(strconv.FormatUint(uint64(r.UnitMultiplier), 10))
	}
	b.WriteString(string(r.Unit))
	if b.Len() < MaxBucketKeyLen {
		return b.String()
	}
	sum := sha256.Sum256([]byte(b.String()))
	return string(api) + "#" + hex.EncodeToString(sum[:])
}

// escape writes s with the bytes in special percent-encoded.
func escape(b *strings.Builder, s, special string) {
	if !strings.ContainsAny(s, special) {
		b.WriteString(s)
		return
	}
	const hexDigits = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if strings.IndexByte(special, c) >= 0 {
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
			continue
		}
		b.WriteByte(c)
	}
}

// Error is a problem in a rules file, with the line and the field at fault.
type Error struct {
	File  string // "" when no file is at fault (no file given)
	Line  int    // 1-based; 0 when the whole file is at fault
	Field string // for example "descriptors[1].rate_limit.unit"
	Msg   string
	// err is the condition a caller may test with errors.Is
	// (ErrPeriodTooLong, ErrTooLarge); nil for the others.
	err error
}

// Unwrap returns the condition behind e, if it is one callers can tell
// apart (ErrPeriodTooLong, ErrTooLarge), else nil.
func (e *Error) Unwrap() error { return e.err }

func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			b.WriteByte(':')
			b.WriteString(strconv.Itoa(e.Line))
		}
		b.WriteString(": ")
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// MaxFileSize is the largest rules file Load and Parse take, in bytes
// (8 MiB). A rules file of a few thousand rules is a few hundred KiB; the cap
// keeps a runaway generator or a wrong path (a log, a core dump) from costing
// the server seconds of CPU and gigabytes of memory in the parser: the
// YAML decoder holds a node of about 100 bytes for every scalar.
const MaxFileSize = 8 << 20

// tooBig is the refusal of a file over MaxFileSize.
func tooBig(file string) error {
	return &Error{File: file, Msg: fmt.Sprintf("file is over the %d MiB maximum (%d bytes)", MaxFileSize>>20, MaxFileSize)}
}

// Load reads and parses the rules file at path. Every error is an *Error
// naming the file, or wraps the error that kept the file from being read. A
// file over MaxFileSize is refused without reading more than MaxFileSize+1
// bytes of it. LoadAll reads several files and directories.
func Load(path string) (*Config, error) {
	data, err := readCapped(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}
