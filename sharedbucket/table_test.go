//go:build linux || darwin

package sharedbucket

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func openTemp(t *testing.T, p Policy, opts ...Option) *Table {
	t.Helper()
	tb, err := Open(filepath.Join(tmpfsDir(t), "t.sbt"), p, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, tb.Close()) })
	return tb
}

func TestSmoke(t *testing.T) {
	tb := openTemp(t, Policy{Limit: 10, Window: time.Second})
	for i := 0; i < 10; i++ {
		require.True(t, tb.Allow("k"), "call %d", i)
	}
	require.False(t, tb.Allow("k"))
	st := tb.Stats()
	require.EqualValues(t, 10, st.Allowed)
	require.EqualValues(t, 1, st.Denied)
	require.Equal(t, 1, st.Keys)
}
