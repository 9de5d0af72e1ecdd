package httplimit

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestOutsideQuotes: the separator counts only outside quoted strings, an
// escaped quote inside one does not end it, and split and cut agree on
// where the first piece ends.
func TestOutsideQuotes(t *testing.T) {
	for _, c := range []struct {
		s     string
		index int
		split []string
	}{
		{``, -1, []string{``}},
		{`a`, -1, []string{`a`}},
		{`a;b`, 1, []string{`a`, `b`}},
		{`a;`, 1, []string{`a`, ``}},
		{`"a;b";c`, 5, []string{`"a;b"`, `c`}},
		{`"a\";b";c;d`, 7, []string{`"a\";b"`, `c`, `d`}},
		{`a\;b`, 2, []string{`a\`, `b`}}, // a backslash escapes only inside quotes
		{`"unterminated;x`, -1, []string{`"unterminated;x`}},
		{`x="a\\";y`, 7, []string{`x="a\\"`, `y`}},
	} {
		assert.Equal(t, c.index, indexOutsideQuotes(c.s, ';'), c.s)
		assert.Equal(t, c.split, splitOutsideQuotes(c.s, ';'), c.s)
		before, after := cutOutsideQuotes(c.s, ';')
		assert.Equal(t, c.split[0], before, c.s)
		if c.index >= 0 {
			assert.Equal(t, c.s[c.index+1:], after, c.s)
		} else {
			assert.Empty(t, after, c.s)
		}
	}
}
