package rules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Parse parses one rules file from data; file names it in errors. It is
// ParseAll of that one file with the zero Options.
//
// It refuses what envoyproxy/ratelimit refuses (an empty domain or key, a
// unit missing or unknown, a unit next to unlimited, a duplicate key and
// value on one level, a domain configured twice, a replaces entry that is
// empty or names its own rule) and, so that no typo passes silently, every
// field it does not know or finds in the wrong place. Fields that only
// shape envoyproxy/ratelimit's statistics (detailed_metric,
// value_to_metric) are accepted and ignored; metadata is carried on the
// rule (Rule.Metadata) and has no effect on decisions.
//
// A file over MaxFileSize is refused before any of it is parsed.
func Parse(file string, data []byte) (*Config, error) {
	return ParseAll([]Source{{Name: file, Data: data}}, Options{})
}

// ParseAll parses rules files into one Config, in order. Every error is an
// *Error naming the file at fault; a domain configured in two files is
// refused naming both, unless opt.MergeDomains. A file with no domain is
// refused, as is an empty list of files. Named rules of one domain that
// replace one another in a cycle (A replaces B, B replaces A, or longer)
// load, as in envoyproxy/ratelimit, with a Config.Warnings entry naming
// every rule of the cycle: a request whose descriptors match them all is
// limited by none of them.
func ParseAll(files []Source, opt Options) (*Config, error) {
	if len(files) == 0 {
		return nil, &Error{Msg: "no rules file"}
	}
	c := &Config{File: files[0].Name, domains: map[string]level{}}
	p := &parser{c: c, opt: opt, domainFile: map[string]string{}}
	for _, f := range files {
		c.Files = append(c.Files, f.Name)
		if err := p.parseFile(f.Name, f.Data); err != nil {
			return nil, err
		}
	}
	c.replacesCycles(p.replacesAt)
	return c, nil
}

func (p *parser) parseFile(file string, data []byte) error {
	if len(data) > MaxFileSize {
		return tooBig(file)
	}
	p.file, p.docs = file, 0
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return p.yamlError(err, data)
		}
		// Measure what the aliases add before reading anything through
		// them (see MaxAliasNodes).
		if err := p.exp.add(p, &n); err != nil {
			return err
		}
		if err := p.document(&n); err != nil {
			return err
		}
	}
	if p.docs == 0 {
		return &Error{File: file, Msg: "no domain configured (want \"domain: NAME\" and \"descriptors:\")"}
	}
	return nil
}

type parser struct {
	file       string // the file being read
	c          *Config
	opt        Options
	domainFile map[string]string // the file that first configured each domain
	docs       int               // domains configured by the file being read
	aliased    int               // descriptors of the load read through an alias (*name), counted as expanded
	exp        expansion         // what the aliases of the load add
	// meta is the metadata value of each node reached through an alias,
	// converted once: every rule whose metadata names it shares it.
	meta map[*yaml.Node]any
	// replacesAt is the field path of each rule's replaces list, for the
	// warning of a replaces cycle.
	replacesAt map[*Rule]string
}

// Bounds that keep a hostile file from costing the server much, far above
// any real rules file: descriptors nested deeper than maxDepth, and more
// than maxAliased descriptors of one load read through aliases (each is a
// rule of its own, so MaxAliasNodes alone would allow tens of thousands).
// Plain descriptors need no count: the file's size bounds them.
const (
	maxDepth   = 32
	maxAliased = 10_000
)

func (p *parser) errf(n *yaml.Node, field, format string, args ...any) error {
	return &Error{File: p.file, Line: n.Line, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// yamlError turns a syntax error ("yaml: line 7: ...") in data into an
// Error at the line at fault.
//
// Why not take the decoder's line: it is where the construct around the
// problem began (the list a mis-indented key breaks, the scalar before a
// tab), one less for some errors, and none for others (an unknown
// anchor). The line at fault is the first whose end, read as the end of
// the file, gives the same error: found by parsing prefixes of data, the
// decoder's line being a lower bound (exponential then binary search). The
// search parses at most maxLineSearchBytes in all (about a second): in a
// file too large for that, the error keeps the decoder's line and says the
// line at fault is further down.
func (p *parser) yamlError(err error, data []byte) error {
	line, msg := splitYAMLError(err)
	if l := problemLine(data, msg, line); l > 0 {
		line = l
	} else if line > 0 {
		msg += " (at this line or further down: the file is too large to find the exact line quickly)"
	}
	return &Error{File: p.file, Line: line, Msg: "bad YAML: " + msg}
}

// splitYAMLError splits "yaml: line 7: problem" into 7 and "problem".
func splitYAMLError(err error) (line int, msg string) {
	msg = err.Error()
	if rest, ok := strings.CutPrefix(msg, "yaml: line "); ok {
		num, tail, _ := strings.Cut(rest, ":")
		if l, cerr := strconv.Atoi(num); cerr == nil {
			return l, strings.TrimSpace(tail)
		}
	}
	return 0, strings.TrimPrefix(msg, "yaml: ")
}

// maxLineSearchBytes bounds the bytes problemLine parses, all its parses
// together: 2 MiB, about a second of the YAML decoder on a loaded core.
// Every file of up to about 150 KiB (some thousands of rules) gets its
// exact line whatever the error; a larger one when the line at fault is
// near the start of the block around it, the usual case.
var maxLineSearchBytes = 2 << 20 // a variable for tests only

// problemLine is the first line k ≥ from such that data up to the end of
// line k fails to parse with msg, or 0 if none is found within
// maxLineSearchBytes of parsing.
func problemLine(data []byte, msg string, from int) int {
	var ends []int // ends[k-1]: the offset just past line k
	for i, c := range data {
		if c == '\n' {
			ends = append(ends, i+1)
		}
	}
	if len(ends) == 0 || ends[len(ends)-1] != len(data) {
		ends = append(ends, len(data))
	}
	n := len(ends)
	from = max(from, 1)
	if from > n {
		return 0
	}
	spent := 0
	// fails reports whether lines 1…k fail with msg; ok is false when the
	// budget does not allow the parse.
	fails := func(k int) (yes, ok bool) {
		if spent += ends[k-1]; spent > maxLineSearchBytes {
			return false, false
		}
		return syntaxError(data[:ends[k-1]]) == msg, true
	}
	lo, hi := from-1, 0 // the line at fault is after lo, at or before hi
	for k, step := from, 1; hi == 0; step *= 2 {
		yes, ok := fails(k)
		switch {
		case !ok:
			return 0
		case yes:
			hi = k
		case k == n:
			return 0 // no prefix fails as the whole did: keep the decoder's line
		default:
			lo, k = k, min(k+step, n)
		}
	}
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		yes, ok := fails(mid)
		switch {
		case !ok:
			return 0
		case yes:
			hi = mid
		default:
			lo = mid
		}
	}
	return hi
}

// syntaxError is the message of the first syntax error in data, "" if none.
func syntaxError(data []byte) string {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return ""
		}
		if err != nil {
			_, msg := splitYAMLError(err)
			return msg
		}
	}
}

func (p *parser) document(doc *yaml.Node) error {
	if doc.Kind == yaml.DocumentNode {
		if len(doc.Content) == 0 {
			return nil
		}
		doc = doc.Content[0]
	}
	if doc.Kind == 0 || (doc.Kind == yaml.ScalarNode && doc.Tag == "!!null") {
		return nil // an empty document (a stray "---")
	}
	if doc.Kind != yaml.MappingNode {
		return p.errf(doc, "", "want a mapping with domain and descriptors")
	}
	var domain string
	var domainNode, descs *yaml.Node
	err := p.fields(doc, "", func(key string, k, v *yaml.Node) error {
		switch key {
		case "domain":
			domainNode = k
			return p.str(v, "domain", &domain)
		case "descriptors":
			descs = v
			return nil
		case "name": // a label some tools write; no meaning here
			var s string
			return p.str(v, "name", &s)
		}
		return p.errf(k, key, "unknown field (want domain or descriptors)")
	})
	if err != nil {
		return err
	}
	switch {
	case domainNode == nil:
		return p.errf(doc, "domain", "missing")
	case domain == "":
		return p.errf(domainNode, "domain", "empty")
	}
	p.docs++
	top, dup := p.c.domains[domain]
	switch {
	case dup && !p.opt.MergeDomains:
		// Why name the first file: with a directory, the two files of one
		// domain are otherwise a hunt.
		// Why name the flag and not Options.MergeDomains: the reader of
		// this message runs sluice serve, not Go.
		return p.errf(domainNode, "domain", "%q is configured twice (first in %s); -merge-domain-config merges a domain's files", domain, p.domainFile[domain])
	case !dup:
		top = level{}
		p.c.domains[domain] = top
		p.domainFile[domain] = p.file
	}
	if descs == nil {
		return nil
	}
	return p.descriptors(descs, "descriptors", domain, nil, top, false)
}

// fields calls f for each key of mapping m, refusing duplicate keys.
func (p *parser) fields(m *yaml.Node, path string, f func(key string, k, v *yaml.Node) error) error {
	m = deref(m)
	if m.Kind != yaml.MappingNode {
		return p.errf(m, path, "want a mapping")
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1] // consumers follow aliases
		name := join(path, k.Value)
		if seen[k.Value] {
			return p.errf(k, name, "given twice")
		}
		seen[k.Value] = true
		if err := f(k.Value, k, v); err != nil {
			return err
		}
	}
	return nil
}

// deref follows YAML aliases (*name) to the node they name.
func deref(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

func (p *parser) str(v *yaml.Node, field string, out *string) error {
	v = deref(v)
	if v.Kind != yaml.ScalarNode || v.Tag == "!!null" {
		return p.errf(v, field, "want a string")
	}
	*out = v.Value
	return nil
}

func (p *parser) boolean(v *yaml.Node, field string, out *bool) error {
	v = deref(v)
	if v.Kind != yaml.ScalarNode || v.Decode(out) != nil {
		return p.errf(v, field, "%q is not true or false", v.Value)
	}
	return nil
}

// uint32From reads a whole number (see wholeNumber) from lo to
// math.MaxUint32 into out. v is a node deref has followed: the caller keeps it
// for later errors.
func (p *parser) uint32From(v *yaml.Node, field string, lo int64, out *uint32) error {
	n, ok := wholeNumber(v)
	if !ok || n < lo || n > math.MaxUint32 {
		return p.errf(v, field, "%q is not a whole number from %d to %d", v.Value, lo, uint32(math.MaxUint32))
	}
	*out = uint32(n)
	return nil
}

// list returns the items of a YAML list (through aliases); null (a key
// with nothing after it) is an empty list. what names the items, for the
// error.
func (p *parser) list(seq *yaml.Node, path, what string) ([]*yaml.Node, error) {
	seq = deref(seq)
	if seq.Kind == yaml.ScalarNode && seq.Tag == "!!null" {
		return nil, nil
	}
	if seq.Kind != yaml.SequenceNode {
		return nil, p.errf(seq, path, "want a list of %s", what)
	}
	return seq.Content, nil
}

// descriptors reads a list of descriptors into a level; aliased says the list
// is (inside) an expanded alias.
func (p *parser) descriptors(seq *yaml.Node, path, domain string, parent []Level, into level, aliased bool) error {
	aliased = aliased || seq.Kind == yaml.AliasNode
	items, err := p.list(seq, path, "descriptors")
	if err != nil {
		return err
	}
	for i, d := range items {
		if aliased || d.Kind == yaml.AliasNode {
			if p.aliased++; p.aliased > maxAliased {
				return p.errf(d, path, "more than %d descriptors through aliases (aliases expanding without end?)", maxAliased)
			}
		}
		if err := p.descriptor(deref(d), fmt.Sprintf("%s[%d]", path, i), domain, parent, into, aliased || d.Kind == yaml.AliasNode); err != nil {
			return err
		}
	}
	return nil
}

func (p *parser) descriptor(d *yaml.Node, path, domain string, parent []Level, into level, aliased bool) error {
	if len(parent) >= maxDepth {
		return p.errf(d, path, "descriptors nested deeper than %d levels (a recursive alias?)", maxDepth)
	}
	var (
		lv                    Level
		keyNode, rl, children *yaml.Node
		shadowNode, quotaNode *yaml.Node
		shadow, quota         bool
		metadata              map[string]any
	)
	err := p.fields(d, path, func(key string, k, v *yaml.Node) error {
		f := join(path, key)
		switch key {
		case "key":
			keyNode = k
			return p.str(v, f, &lv.Key)
		case "value":
			return p.str(v, f, &lv.Value)
		case "rate_limit":
			rl = v
			return nil
		case "descriptors":
			children = v
			return nil
		case "shadow_mode":
			shadowNode = k
			return p.boolean(v, f, &shadow)
		case "quota_mode":
			quotaNode = k
			return p.boolean(v, f, &quota)
		case "metadata":
			var err error
			metadata, err = p.metadata(v, f)
			return err
		case "share_threshold":
			return p.boolean(v, f, &lv.Share)
		case "detailed_metric", "value_to_metric":
			var ignored bool
			return p.boolean(v, f, &ignored)
		}
		return p.errf(k, f, "unknown field (want key, value, rate_limit, shadow_mode, quota_mode, share_threshold, metadata or descriptors)")
	})
	if err != nil {
		return err
	}
	if keyNode == nil {
		return p.errf(d, join(path, "key"), "missing")
	}
	if lv.Key == "" {
		return p.errf(keyNode, join(path, "key"), "empty")
	}
	wild := strings.Contains(lv.Value, "*")
	if lv.Share && !wild {
		return p.errf(d, join(path, "share_threshold"), "needs a value with a '*' wildcard")
	}
	k := into[lv.Key]
	if k == nil {
		k = &keyed{exact: map[string]*node{}}
		into[lv.Key] = k
	}
	n := &node{children: level{}}
	dup := false
	switch {
	case lv.Value == "":
		dup, k.any = k.any != nil, n
	case wild:
		for _, w := range k.wild {
			dup = dup || strings.Join(w.parts, "*") == lv.Value
		}
		k.wild = append(k.wild, wildcard{parts: strings.Split(lv.Value, "*"), n: n})
	default:
		dup = k.exact[lv.Value] != nil
		k.exact[lv.Value] = n
	}
	if dup {
		return p.errf(d, path, "key %q with value %q is configured twice on this level", lv.Key, lv.Value)
	}
	levels := append(append([]Level(nil), parent...), lv)
	if rl != nil {
		r, err := p.rateLimit(rl, join(path, "rate_limit"), domain, levels)
		if err != nil {
			return err
		}
		r.Shadow, r.QuotaMode, r.Metadata = shadow, quota, metadata
		r.File, r.Line = p.file, d.Line
		r.Index = len(p.c.Rules)
		p.c.Rules = append(p.c.Rules, r)
		n.rule = r
	} else {
		// Why refuse what envoyproxy/ratelimit ignores: a flag on a
		// descriptor without rate_limit does nothing, and is most often
		// one indented a level too deep or too shallow.
		switch {
		case shadow:
			return p.errf(shadowNode, join(path, "shadow_mode"), "needs a rate_limit on the same descriptor")
		case quota:
			return p.errf(quotaNode, join(path, "quota_mode"), "needs a rate_limit on the same descriptor")
		}
	}
	if children != nil {
		return p.descriptors(children, join(path, "descriptors"), domain, levels, n.children, aliased)
	}
	return nil
}

func (p *parser) rateLimit(m *yaml.Node, path, domain string, levels []Level) (*Rule, error) {
	r := &Rule{Domain: domain, Path: levels}
	var unitNode, rpuNode, unlNode, multNode *yaml.Node
	var unit string
	err := p.fields(m, path, func(key string, k, v *yaml.Node) error {
		f := join(path, key)
		switch key {
		case "unit":
			unitNode = v
			return p.str(v, f, &unit)
		case "requests_per_unit":
			rpuNode = deref(v)
			return p.uint32From(rpuNode, f, 0, &r.RequestsPerUnit)
		case "unlimited":
			unlNode = v
			return p.boolean(v, f, &r.Unlimited)
		case "unit_multiplier":
			multNode = deref(v)
			return p.uint32From(multNode, f, 1, &r.UnitMultiplier)
		case "name":
			return p.str(v, f, &r.Name)
		case "replaces":
			if p.replacesAt == nil {
				p.replacesAt = map[*Rule]string{}
			}
			p.replacesAt[r] = f
			return p.replaces(v, f, &r.Replaces)
		}
		return p.errf(k, f, "unknown field (want unit, requests_per_unit, unit_multiplier, unlimited, name or replaces)")
	})
	if err != nil {
		return nil, err
	}
	r.Named = r.Name != ""
	for i, name := range r.Replaces {
		// Why only after every field: name may follow replaces.
		if r.Named && name == r.Name {
			return nil, p.errf(m, fmt.Sprintf("%s.replaces[%d].name", path, i), "%q is this rule's own name", name)
		}
	}
	if r.Name == "" {
		var b strings.Builder
		b.WriteString(domain)
		for _, l := range levels {
			b.WriteByte('.')
			b.WriteString(l.Key)
			if l.Value != "" {
				b.WriteByte('_')
				b.WriteString(l.Value)
			}
		}
		r.Name = b.String()
	}
	if r.Unlimited {
		switch {
		case unitNode != nil:
			return nil, p.errf(unitNode, join(path, "unit"), "must not be given with unlimited: true")
		case rpuNode != nil:
			return nil, p.errf(rpuNode, join(path, "requests_per_unit"), "must not be given with unlimited: true")
		case multNode != nil:
			return nil, p.errf(multNode, join(path, "unit_multiplier"), "must not be given with unlimited: true")
		}
		return r, nil
	}
	if unitNode == nil {
		at := m
		if unlNode != nil {
			at = unlNode
		}
		return nil, p.errf(at, join(path, "unit"), "missing (want second, minute, hour, day, week or month)")
	}
	r.Unit = Unit(strings.ToLower(unit))
	if r.Unit == Year {
		// Why a message of its own: envoyproxy/ratelimit takes year, so a
		// file written for it says it on purpose; the store's complaint
		// (a fractional rate, a duration in hours) would not say why.
		return nil, p.errf(unitNode, join(path, "unit"), "year is not supported; at most month (periods are at most %d days)", MaxPeriod/(24*time.Hour))
	}
	if _, ok := unitLength[r.Unit]; !ok {
		return nil, p.errf(unitNode, join(path, "unit"), "%q is not a unit (want second, minute, hour, day, week or month)", unit)
	}
	if rpuNode == nil {
		return nil, p.errf(m, join(path, "requests_per_unit"), "missing")
	}
	// Check the period before any arithmetic uses it: unit × multiplier
	// may not fit in a Duration at all.
	if _, err := PeriodOf(r.Unit, r.UnitMultiplier); err != nil {
		at, field := unitNode, join(path, "unit")
		if multNode != nil {
			at, field = multNode, join(path, "unit_multiplier")
		}
		return nil, &Error{File: p.file, Line: at.Line, Field: field, Msg: err.Error(), err: err}
	}
	if pol, ok := r.Policy(); ok {
		if err := pol.Validate(); err != nil {
			return nil, p.errf(rpuNode, path, "%d per %s: %v", r.RequestsPerUnit, r.per(), err)
		}
	}
	return r, nil
}

// wholeNumber reads a scalar that is a whole number: an integer (5, 0x10,
// 1_000) or a float with no fractional part (10.0, 1e3). Why not
// yaml.Node.Decode into an int64 alone: the decoder truncates a float, so
// 0.9 would become 0 (a rule that denies everything) and 9.99 would be 9.
func wholeNumber(v *yaml.Node) (int64, bool) {
	if v.Kind != yaml.ScalarNode {
		return 0, false
	}
	switch v.ShortTag() {
	case "!!int":
		var n int64
		return n, v.Decode(&n) == nil
	case "!!float":
		var f float64
		// 2^63 and beyond (and NaN) fail the range check: no int64 holds them.
		if v.Decode(&f) != nil || f != math.Trunc(f) || !(f > -1<<63 && f < 1<<63) {
			return 0, false
		}
		return int64(f), true
	}
	return 0, false
}

// replaces reads rate_limit.replaces: a list of {name: NAME}. An empty name
// is refused, as envoyproxy/ratelimit does.
func (p *parser) replaces(seq *yaml.Node, path string, out *[]string) error {
	items, err := p.list(seq, path, "{name: NAME}")
	if err != nil {
		return err
	}
	for i, e := range items {
		f := fmt.Sprintf("%s[%d]", path, i)
		var name string
		err := p.fields(e, f, func(key string, k, v *yaml.Node) error {
			if key != "name" {
				return p.errf(k, join(f, key), "unknown field (want name)")
			}
			if d := deref(v); d.Kind == yaml.ScalarNode && d.Tag == "!!null" {
				return nil // "- name:" with nothing after: empty, refused below
			}
			return p.str(v, join(f, key), &name)
		})
		if err != nil {
			return err
		}
		if name == "" {
			return p.errf(deref(e), join(f, "name"), "empty or missing (want the rate_limit.name of the rule replaced)")
		}
		*out = append(*out, name)
	}
	return nil
}

// metadata reads a descriptor's metadata: any mapping, kept as plain Go
// values (maps with string keys, lists, strings, numbers, booleans, nil),
// as envoyproxy/ratelimit does before it makes a protobuf Struct (a key 1
// becomes "1"). Merge keys (<<: *base) merge as YAML says. A node reached
// through an alias is converted once, and every rule naming it shares the
// value: 1,000 rules with metadata: *m hold one copy (MaxAliasNodes bounds
// what the aliases stand for).
func (p *parser) metadata(v *yaml.Node, path string) (map[string]any, error) {
	if d := deref(v); d.Kind == yaml.ScalarNode && d.Tag == "!!null" {
		return nil, nil
	} else if d.Kind != yaml.MappingNode {
		return nil, p.errf(d, path, "want a mapping")
	}
	m, err := p.metaValue(v, path)
	if err != nil {
		return nil, err
	}
	if mm := m.(map[string]any); len(mm) > 0 {
		return mm, nil
	}
	return nil, nil
}

func (p *parser) metaValue(n *yaml.Node, path string) (any, error) {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		t := deref(n)
		if v, ok := p.meta[t]; ok {
			return v, nil
		}
		v, err := p.metaValue(t, path)
		if err != nil {
			return nil, err
		}
		if p.meta == nil {
			p.meta = map[*yaml.Node]any{}
		}
		p.meta[t] = v
		return v, nil
	}
	switch n.Kind {
	case yaml.ScalarNode:
		var v any
		if err := n.Decode(&v); err != nil {
			return nil, p.errf(n, path, "%v", err)
		}
		return v, nil
	case yaml.SequenceNode:
		out := make([]any, len(n.Content))
		for i, c := range n.Content {
			v, err := p.metaValue(c, fmt.Sprintf("%s[%d]", path, i))
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	case yaml.MappingNode:
		return p.metaMap(n, path)
	}
	return nil, p.errf(n, path, "unexpected YAML node")
}

func (p *parser) metaMap(n *yaml.Node, path string) (map[string]any, error) {
	out := make(map[string]any, len(n.Content)/2)
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return nil, p.errf(k, path, "a key that is a list or a mapping (want a string)")
		}
		if k.ShortTag() == "!!merge" {
			merges = append(merges, v)
			continue
		}
		var kv any
		if err := k.Decode(&kv); err != nil {
			return nil, p.errf(k, path, "%v", err)
		}
		key := fmt.Sprint(kv)
		if _, dup := out[key]; dup {
			return nil, p.errf(k, join(path, key), "given twice")
		}
		val, err := p.metaValue(v, join(path, key))
		if err != nil {
			return nil, err
		}
		out[key] = val
	}
	// A merge adds the keys the mapping does not give itself; of a list of
	// merged mappings, the first that gives a key wins (YAML's merge key).
	for _, mv := range merges {
		src := []*yaml.Node{mv}
		if d := deref(mv); d.Kind == yaml.SequenceNode {
			src = d.Content
		}
		for _, s := range src {
			if deref(s).Kind != yaml.MappingNode {
				return nil, p.errf(deref(s), join(path, "<<"), "want a mapping or a list of mappings to merge")
			}
			v, err := p.metaValue(s, join(path, "<<"))
			if err != nil {
				return nil, err
			}
			for k, e := range v.(map[string]any) {
				if _, ok := out[k]; !ok {
					out[k] = e
				}
			}
		}
	}
	return out, nil
}
