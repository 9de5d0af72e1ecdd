package httplimit

import (
	"math"
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
		n, ok := sfInteger(v)
		if !ok {
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

// sfInteger reads an Integer parameter value: an optional minus and
// digits. Where RFC 9651 refuses more than 15 digits, it saturates at
// ±math.MaxInt64 instead: t=100000000000000000000 still means "a long
// time" (capped at MaxHold), never a malformed field, ignored, and so no
// wait at all.
func sfInteger(v string) (int64, bool) {
	neg := strings.HasPrefix(v, "-")
	if neg {
		v = v[1:]
	}
	n, ok := parseDigits(v)
	if neg {
		n = -n
	}
	return n, ok
}

// parseDigits reads a non-empty run of ASCII digits, saturating at
// math.MaxInt64: a count too large for an int64 is still a large count.
func parseDigits(s string) (int64, bool) {
	if s == "" {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		d := s[i] - '0'
		if d > 9 {
			return 0, false
		}
		if n > (math.MaxInt64-int64(d))/10 {
			n = math.MaxInt64
			continue
		}
		n = n*10 + int64(d)
	}
	return n, true
}
