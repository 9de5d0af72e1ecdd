package httplimit

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestParseSFList(t *testing.T) {
	got := parseSFList([]string{`"a,b";r=0;t=3, "q\"x";q=5;w=2;sluice-burst=7`, `tok;r=1;flag;t=2`})
	assert.Equal(t, []sfItem{
		{name: "a,b", params: map[string]int64{"r": 0, "t": 3}},
		{name: `q"x`, params: map[string]int64{"q": 5, "w": 2, "sluice-burst": 7}},
		{name: "tok", params: map[string]int64{"r": 1, "t": 2}},
	}, got)

	// Malformed members are dropped, the rest stand (the draft: malformed
	// fields MUST be ignored).
	got = parseSFList([]string{`"bad";r=x;t=1, "neg";r=-1;t=1, "ok";r=0;t=4, "unterminated;r=0;t=9`})
	assert.Equal(t, []sfItem{{name: "ok", params: map[string]int64{"r": 0, "t": 4}}}, got)
	assert.Empty(t, parseSFList([]string{"", " , ;"}))

	// An integer beyond int64 saturates: it is a large figure, not a
	// malformed one (a wait of "forever" must not become no wait).
	got = parseSFList([]string{`"big";r=0;t=100000000000000000000, "neg";r=0;t=-100000000000000000000, "dec";r=0;t=1.5`})
	assert.Equal(t, []sfItem{{name: "big", params: map[string]int64{"r": 0, "t": math.MaxInt64}}}, got)
}

func TestParseDigits(t *testing.T) {
	for s, want := range map[string]int64{
		"0": 0, "007": 7, "9223372036854775806": math.MaxInt64 - 1, "9223372036854775807": math.MaxInt64,
		"9223372036854775808": math.MaxInt64, "100000000000000000000": math.MaxInt64,
		strings.Repeat("9", 1000) + "1": math.MaxInt64,
	} {
		n, ok := parseDigits(s)
		assert.True(t, ok, s)
		assert.Equal(t, want, n, s)
	}
	for _, s := range []string{"", "-1", "+1", "1 ", "1.5", "1e3", "٣", "99999999999999999999x"} {
		_, ok := parseDigits(s)
		assert.False(t, ok, s)
	}
}
