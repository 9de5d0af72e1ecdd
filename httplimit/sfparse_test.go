package httplimit

import (
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
}
