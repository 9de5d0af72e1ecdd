package service

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReplyTextParts(t *testing.T) {
	build := func() []string {
		var arr [256]byte
		r := replyText{buf: arr[:0]}
		r.buf = strconv.AppendInt(r.buf, 999, 10)
		require.Equal(t, 0, r.end())
		r.buf = append(r.buf, `"default";r=999;t=1`...)
		require.Equal(t, 1, r.end())
		require.Equal(t, 2, r.end()) // an empty part
		r.buf = append(r.buf, `{"allowed":true,"remaining":999.5}`+"\n"...)
		require.Equal(t, 3, r.end())
		return r.strings()
	}
	assert.Equal(t, []string{"999", `"default";r=999;t=1`, "", `{"allowed":true,"remaining":999.5}` + "\n"}, build())
	assert.Equal(t, 2.0, testing.AllocsPerRun(100, func() { _ = build() }),
		"the text and the []string: the stack buffer must not escape")

	var zero replyText // no buffer given: it grows one
	zero.buf = append(zero.buf, "x"...)
	zero.end()
	assert.Equal(t, []string{"x"}, zero.strings())
}
