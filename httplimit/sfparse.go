package httplimit

import (
	"strconv"
	"strings"
)

// sfItem is one member of a structured-field List (RFC 9651) with its
// integer parameters; other parameters are skipped.
type sfItem struct {
	name   string
	params map[string]int64
}

// parseSFList parses the List members of the given field lines, as the
// RateLimit and RateLimit-Policy fields use them: an item (a string or a
// token) followed by ;key=value parameters. A member that does not parse is
// dropped; the rest stand.
func parseSFList(lines []string) []sfItem {
	var out []sfItem
	for _, line := range lines {
		for _, member := range splitOutsideQuotes(line, ',') {
			if it, ok := parseSFItem(strings.TrimSpace(member)); ok {
				out = append(out, it)
			}
		}
	}
	return out
}

func parseSFItem(s string) (sfItem, bool) {
	parts := splitOutsideQuotes(s, ';')
	if len(parts) == 0 {
		return sfItem{}, false
	}
	name := strings.TrimSpace(parts[0])
	if strings.HasPrefix(name, `"`) {
		u, err := strconv.Unquote(name)
		if err != nil {
			return sfItem{}, false
		}
		name = u
	}
	if name == "" {
		return sfItem{}, false
	}
	it := sfItem{name: name, params: map[string]int64{}}
	for _, p := range parts[1:] {
		k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok {
			continue // a boolean parameter: nothing we use
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			if k == "q" || k == "w" || k == "r" || k == "t" {
				return sfItem{}, false // a defined parameter that is not an integer: malformed
			}
			continue
		}
		if n < 0 {
			return sfItem{}, false
		}
		it.params[k] = n
	}
	return it, true
}

// splitOutsideQuotes splits s at sep where sep is not inside a quoted string.
func splitOutsideQuotes(s string, sep byte) []string {
	var out []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && quoted:
			i++
		case c == '"':
			quoted = !quoted
		case c == sep && !quoted:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}
