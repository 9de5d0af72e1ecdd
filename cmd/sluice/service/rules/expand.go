package rules

import (
	"errors"
	"fmt"

	"go.yaml.in/yaml/v3"
)

// Bounds on what YAML aliases add to a load (one ParseAll or LoadAll, all
// its files together). A rules file is at most MaxFileSize, but an alias
// (*name) stands for a whole copy of the node it names, and aliases of
// aliases multiply: a few KiB can spell billions of nodes. So the parser
// measures, before it reads any rule, what every alias of a file would add
// once expanded (the nodes and the bytes of scalar text of the node it
// names, aliases inside counted as expanded too) and refuses the file, at
// the alias that crosses the bound, when the aliases of the load would
// add more than MaxAliasNodes nodes or MaxAliasBytes bytes. The measure is
// memoised per named node, so it costs time in proportion to the file as
// written, whatever the expansion, and allocates nothing per copy.
//
// Why these numbers: far above what aliases are used for (a rate_limit
// block of 5 nodes reused by 20,000 rules is 100,000 nodes), and low
// enough that what the rules keep of an expansion is small. They keep
// little: metadata reached through one alias is converted once and shared
// by every rule that names it, descriptors reached through aliases are at
// most 10,000 per load (each is a rule of its own), and a replaces list
// through an alias is a slice of shared strings.
const (
	MaxAliasNodes = 250_000
	MaxAliasBytes = 16 << 20
)

// ErrTooLarge is the condition (wrapped by an *Error) of a load whose
// aliases expand past MaxAliasNodes or MaxAliasBytes, or whose alias names
// a node that contains it (an expansion without end).
var ErrTooLarge = errors.New("rules expand too large")

// expansion measures what aliases add to one load.
type expansion struct {
	sizes map[*yaml.Node]*expSize // by named node (an alias's target)
	added expSize                 // by every alias of the load so far
}

type expSize struct {
	nodes, bytes int64
	busy         bool // being measured: an alias to it now is recursive
}

// add measures the aliases of one document as written, and refuses it
// when they take the load past the bounds or one is recursive.
func (x *expansion) add(p *parser, n *yaml.Node) error {
	if n.Kind == yaml.AliasNode {
		s, rec := x.size(n.Alias)
		if rec != nil {
			return &Error{File: p.file, Line: n.Line, err: ErrTooLarge,
				Msg: fmt.Sprintf("alias *%s names a node that contains itself (a recursive alias expands without end)", n.Value)}
		}
		x.added = sum(x.added, s)
		switch {
		case x.added.nodes > MaxAliasNodes:
			return &Error{File: p.file, Line: n.Line, err: ErrTooLarge,
				Msg: fmt.Sprintf("aliases expand the rules past %d nodes, the limit for the aliases of one load (*%s alone adds %s)", MaxAliasNodes, n.Value, count(s.nodes, MaxAliasNodes))}
		case x.added.bytes > MaxAliasBytes:
			return &Error{File: p.file, Line: n.Line, err: ErrTooLarge,
				Msg: fmt.Sprintf("aliases expand the rules past %d bytes of text, the limit for the aliases of one load (*%s alone adds %s)", MaxAliasBytes, n.Value, count(s.bytes, MaxAliasBytes))}
		}
		return nil
	}
	for _, c := range n.Content {
		if err := x.add(p, c); err != nil {
			return err
		}
	}
	return nil
}

// size is the size of n with every alias in it expanded, saturating past
// the bounds; rec is the node of a recursive alias met on the way.
func (x *expansion) size(n *yaml.Node) (s expSize, rec *yaml.Node) {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	var memo *expSize
	if n.Anchor != "" { // only named nodes can be reached twice
		if m, ok := x.sizes[n]; ok {
			if m.busy {
				return expSize{}, n
			}
			return *m, nil
		}
		if x.sizes == nil {
			x.sizes = map[*yaml.Node]*expSize{}
		}
		memo = &expSize{busy: true}
		x.sizes[n] = memo
	}
	s = expSize{nodes: 1, bytes: int64(len(n.Value))}
	for _, c := range n.Content {
		cs, r := x.size(c)
		if r != nil {
			return expSize{}, r
		}
		s = sum(s, cs)
	}
	if memo != nil {
		*memo = s
	}
	return s, nil
}

// sum adds sizes, saturating just past the bounds so no count overflows.
func sum(a, b expSize) expSize {
	return expSize{nodes: min(a.nodes+b.nodes, MaxAliasNodes+1), bytes: min(a.bytes+b.bytes, MaxAliasBytes+1)}
}

// count prints a count saturated past bound as "more than" it.
func count(n, bound int64) string {
	if n > bound {
		return fmt.Sprintf("more than %d", bound)
	}
	return fmt.Sprint(n)
}
