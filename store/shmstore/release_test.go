//go:build linux || darwin

package shmstore_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/sharedbucket"
	"github.com/sluice-go/sluice/store"
)

// Release closes a table once every Prepare of it is undone, and removes
// its file unless another store (another process) still holds it; a
// decision on a released policy opens it again, and the next Release closes
// that too.
func TestReleaseRemovesUnheldTables(t *testing.T) {
	dir := shmDir(t)
	files := func() int {
		m, err := filepath.Glob(filepath.Join(dir, "*"+sharedbucket.TableExt))
		require.NoError(t, err)
		return len(m)
	}
	a, b := open(t, dir), open(t, dir)
	p := store.Policy{Name: "p", Rate: 5, Burst: 5}
	q := store.Policy{Name: "q", Rate: 5, Burst: 5} // the same table as p
	ctx := context.Background()

	require.NoError(t, a.Prepare(p, q))
	require.NoError(t, b.Prepare(p))
	r, err := a.Allow(ctx, "k", 5, p)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	a.Release(p)
	r, err = a.Allow(ctx, "k", 1, q)
	require.NoError(t, err)
	assert.False(t, r.Allowed, "q still prepared: the table and its drained bucket stay")

	a.Release(q)
	assert.Equal(t, 1, files(), "b holds the file: it stays, with its buckets")
	r, err = b.Allow(ctx, "k", 1, p)
	require.NoError(t, err)
	assert.False(t, r.Allowed, "b's bucket is the drained one")

	b.Release(p)
	assert.Equal(t, 0, files(), "nobody holds it: removed")
	b.Release(p) // not prepared: nothing to do

	// A decision after the release opens the table again (a fresh file);
	// the next Release closes it, and removes the file.
	r, err = a.Allow(ctx, "k", 1, p)
	require.NoError(t, err)
	assert.True(t, r.Allowed)
	assert.Equal(t, 1, files())
	a.Release()
	assert.Equal(t, 0, files())
}
