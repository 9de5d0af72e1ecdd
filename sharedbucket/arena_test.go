//go:build linux || darwin

package sharedbucket

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/limitresponse"
)

// TestTableNamesArePolicyNames: a table name is a file name, so its rule is
// narrower than the policy-name rule httplimit and the service share; every
// name an Arena accepts passes that rule too.
func TestTableNamesArePolicyNames(t *testing.T) {
	for c := range 256 {
		name := "a" + string(rune(c))
		if c >= 0x80 {
			name = "a" + string([]byte{byte(c)})
		}
		if validName(name) == nil {
			assert.NoError(t, limitresponse.CheckName(name), "%q", name)
		}
	}
}

func TestArena(t *testing.T) {
	dir := tmpfsDir(t)
	a, err := NewArena(dir)
	require.NoError(t, err)
	login := Policy{Limit: 5, Window: 300 * time.Second}
	api := Policy{Limit: 1000, Window: time.Minute}

	l1, err := a.Rate("login", login)
	require.NoError(t, err)
	l2, err := a.Rate("login", login)
	require.NoError(t, err)
	assert.Same(t, l1, l2, "one open table per name in an Arena")
	ap, err := a.Rate("api", api, WithSlots(256))
	require.NoError(t, err)
	assert.Equal(t, 256, ap.Slots())
	assert.ElementsMatch(t, []string{"login.sbt", "api.sbt"}, entries(t, dir))

	_, err = a.Rate("login", api)
	assert.ErrorIs(t, err, ErrPolicyMismatch)
	_, err = a.Rate("api", api)
	assert.ErrorIs(t, err, ErrPolicyMismatch, "slot count is part of the identity")
	_, err = a.Rate("api", Policy{})
	assert.ErrorContains(t, err, "Policy.Limit = 0")

	// A second Arena (another process, in effect) shares the tables.
	b, err := NewArena(dir)
	require.NoError(t, err)
	require.True(t, l1.AllowAt("alice", 5, t0))
	bl, err := b.Rate("login", login)
	require.NoError(t, err)
	assert.NotSame(t, l1, bl)
	assert.False(t, bl.AllowAt("alice", 1, t0))
	_, err = b.Rate("login", Policy{Limit: 6, Window: 300 * time.Second})
	assert.ErrorIs(t, err, ErrPolicyMismatch)
	require.NoError(t, b.Close())
	assert.False(t, bl.Allow("x"), "Close closed the Arena's tables")

	for _, bad := range []string{"", ".hidden", "a/b", "../x", "sp ace", string(make([]byte, 129))} {
		_, err := a.Rate(bad, login)
		assert.Error(t, err, "name %q", bad)
	}

	require.NoError(t, a.Close())
	require.NoError(t, a.Close())
	_, err = a.Rate("login", login)
	assert.ErrorIs(t, err, ErrClosed)
	assert.False(t, l1.Allow("x"))
	// The files stay: tables outlive any one process.
	assert.FileExists(t, filepath.Join(dir, "login"+TableExt))

	// A table closed by hand is reopened by the next Rate.
	c, err := NewArena(dir)
	require.NoError(t, err)
	defer c.Close()
	t1, err := c.Rate("api", api, WithSlots(256))
	require.NoError(t, err)
	require.NoError(t, t1.Close())
	t2, err := c.Rate("api", api, WithSlots(256))
	require.NoError(t, err)
	assert.NotSame(t, t1, t2)
	assert.True(t, t2.Allow("k"))
}
