package sharedbucket

import (
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestSparseFileAllocated: a valid table whose slot pages are holes (on a
// full filesystem the first touch of a hole is a SIGBUS) is allocated by
// Open before it is mapped, or, when that fails, refused with ErrCorrupt.
func TestSparseFileAllocated(t *testing.T) {
	dir := tmpfsDir(t)
	path := filepath.Join(dir, "s.sbt")
	tb, err := Open(path, fileP, WithSlots(4096))
	require.NoError(t, err)
	require.NoError(t, tb.Close())
	size := int64(headerSize + 4096*slotSize)
	punch := func() {
		fd, err := unix.Open(path, unix.O_RDWR, 0)
		require.NoError(t, err)
		defer unix.Close(fd)
		err = unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, headerSize+4096, size-headerSize-4096)
		if err != nil {
			t.Skipf("cannot punch holes here: %v", err)
		}
		var st unix.Stat_t
		require.NoError(t, unix.Fstat(fd, &st))
		require.Less(t, st.Blocks*512, st.Size, "the file is sparse")
	}
	punch()
	tb, err = Open(path, fileP, WithSlots(4096))
	require.NoError(t, err, "a sparse file is allocated, not refused, when there is room")
	var st unix.Stat_t
	require.NoError(t, unix.Stat(path, &st))
	assert.GreaterOrEqual(t, st.Blocks*512, st.Size, "every block allocated before the mapping is used")
	for i := range 4096 {
		tb.AllowAt("k"+strconv.Itoa(i), 1, t0) // touches every page
	}
	require.NoError(t, tb.Close())

	// No room: refused with ErrCorrupt, never mapped.
	punch()
	allocateHook = func(int, int64, bool) error { return unix.ENOSPC }
	defer func() { allocateHook = nil }()
	_, err = Open(path, fileP, WithSlots(4096))
	require.ErrorIs(t, err, ErrCorrupt)
	assert.ErrorContains(t, err, "sparse file")
	assert.ErrorContains(t, err, "no space left")
}
