package store_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/store"
)

func TestParseFailMode(t *testing.T) {
	for _, m := range []store.FailMode{store.FailOpen, store.FailClosed} {
		got, err := store.ParseFailMode(m.String())
		require.NoError(t, err)
		assert.Equal(t, m, got)
	}
	assert.Equal(t, "open", store.FailOpen.String())
	assert.Equal(t, "closed", store.FailClosed.String())
	_, err := store.ParseFailMode("sometimes")
	assert.EqualError(t, err, `fail mode "sometimes": want open or closed`)
	_, err = store.ParseFailMode("default")
	assert.Error(t, err, "the zero FailMode is no choice to parse")
}

// The zero FailMode is none of the choices: each taker's default applies.
func TestFailModeZero(t *testing.T) {
	var m store.FailMode
	assert.NotEqual(t, store.FailOpen, m)
	assert.NotEqual(t, store.FailClosed, m)
	assert.Equal(t, "default", m.String())
	assert.Equal(t, "FailMode(9)", store.FailMode(9).String())
}
