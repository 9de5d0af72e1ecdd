package httplimit

// The header fields this package reads (Forwarded, RateLimit,
// RateLimit-Policy) quote alike: a quoted string starts and ends with '"',
// and inside one a backslash escapes the next byte (RFC 9110's
// quoted-string, RFC 9651's String). A separator inside quotes is text.

// indexOutsideQuotes returns the index of the first sep in s that is not
// inside a quoted string, or -1 if there is none.
func indexOutsideQuotes(s string, sep byte) int {
	quoted := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && quoted:
			i++
		case c == '"':
			quoted = !quoted
		case c == sep && !quoted:
			return i
		}
	}
	return -1
}

// cutOutsideQuotes splits s at the first sep that is not inside a quoted
// string; without one, after is "".
func cutOutsideQuotes(s string, sep byte) (before, after string) {
	if i := indexOutsideQuotes(s, sep); i >= 0 {
		return s[:i], s[i+1:]
	}
	return s, ""
}

// splitOutsideQuotes splits s at every sep that is not inside a quoted
// string. Why a scan that starts again after each sep is the same as one
// scan: at a sep outside quotes the scan is outside quotes.
func splitOutsideQuotes(s string, sep byte) []string {
	var out []string
	for {
		i := indexOutsideQuotes(s, sep)
		if i < 0 {
			return append(out, s)
		}
		out = append(out, s[:i])
		s = s[i+1:]
	}
}
