package rules

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// replacesCycles adds to c.Warnings one warning for each set of named rules
// of a domain that replace one another in a cycle (A replaces B, B
// replaces A; or longer). A request whose descriptors match every rule of
// such a set is limited by none of them: each is replaced by another.
//
// Why warn and not refuse: envoyproxy/ratelimit takes such files (its
// loader refuses only an empty name and a rule's own name, and its
// service drops every matched rule that another matched rule replaces),
// and a file written for it must load here. Why per domain: one request
// names one domain, so rules of two domains never meet in one answer.
// at gives the field path of each rule's replaces, for the warning.
func (c *Config) replacesCycles(at map[*Rule]string) {
	byDomain := map[string][]*Rule{}
	var domains []string
	for _, r := range c.Rules {
		if !r.Named {
			continue // never replaced, so in no cycle
		}
		if _, ok := byDomain[r.Domain]; !ok {
			domains = append(domains, r.Domain)
		}
		byDomain[r.Domain] = append(byDomain[r.Domain], r)
	}
	for _, d := range domains {
		for _, scc := range cyclesOf(byDomain[d]) {
			c.Warnings = append(c.Warnings, cycleWarning(d, scc, byDomain[d], at))
		}
	}
}

// cyclesOf returns the strongly connected components of more than one name
// in the graph "name replaces name" of rules (named, one domain), each as
// the names in the order they first appear, components in the order of
// their first name (Tarjan's algorithm).
func cyclesOf(rs []*Rule) [][]string {
	var names []string
	byName := map[string][]*Rule{}
	for _, r := range rs {
		if _, ok := byName[r.Name]; !ok {
			names = append(names, r.Name)
		}
		byName[r.Name] = append(byName[r.Name], r)
	}
	first := map[string]int{}
	for i, n := range names {
		first[n] = i
	}
	index, low, onStack := map[string]int{}, map[string]int{}, map[string]bool{}
	var stack []string
	var out [][]string
	var visit func(n string)
	visit = func(n string) {
		index[n], low[n] = len(index), len(index)
		stack = append(stack, n)
		onStack[n] = true
		for _, r := range byName[n] {
			for _, m := range r.Replaces {
				if _, exists := byName[m]; !exists {
					continue
				}
				if _, seen := index[m]; !seen {
					visit(m)
					low[n] = min(low[n], low[m])
				} else if onStack[m] {
					low[n] = min(low[n], index[m])
				}
			}
		}
		if low[n] != index[n] {
			return
		}
		var scc []string
		for {
			m := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			onStack[m] = false
			scc = append(scc, m)
			if m == n {
				break
			}
		}
		if len(scc) > 1 {
			out = append(out, scc)
		}
	}
	for _, n := range names {
		if _, seen := index[n]; !seen {
			visit(n)
		}
	}
	// Each component in file order of its names, components in file order
	// of their first name: the same file always warns the same way.
	for _, scc := range out {
		slices.SortFunc(scc, func(a, b string) int { return first[a] - first[b] })
	}
	slices.SortFunc(out, func(a, b []string) int { return first[a[0]] - first[b[0]] })
	return out
}

// cycleWarning describes one cycle: every rule of it (in file order) with
// the names of the cycle it replaces.
func cycleWarning(domain string, names []string, rs []*Rule, at map[*Rule]string) *Error {
	in := map[string]bool{}
	for _, n := range names {
		in[n] = true
	}
	var b strings.Builder
	fmt.Fprintf(&b, "rules of domain %q replace one another in a cycle: ", domain)
	var firstRule *Rule
	for _, r := range rs {
		if !in[r.Name] {
			continue
		}
		var repl []string
		for _, m := range r.Replaces {
			if in[m] {
				repl = append(repl, strconv.Quote(m))
			}
		}
		if len(repl) == 0 {
			continue
		}
		if firstRule == nil {
			firstRule = r
		} else {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%q (%s:%d) replaces %s", r.Name, r.File, r.Line, strings.Join(repl, " and "))
	}
	b.WriteString("; a request whose descriptors match all of them is limited by none")
	return &Error{File: firstRule.File, Line: firstRule.Line, Field: at[firstRule], Msg: b.String()}
}
