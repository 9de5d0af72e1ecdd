package sharedbucket

import (
	"errors"

	"golang.org/x/sys/unix"
)

// allocate reserves every block of the file's first size bytes. macOS has no
// fallocate that fills holes, so a new file is written with zeros, and an
// existing sparse file is refused: writing zeros into its holes could
// overwrite what another process is writing there through its mapping.
func allocate(fd int, size int64, existing bool) error {
	if existing {
		return errors.New("holes cannot be filled safely on macOS")
	}
	return writeZeros(fd, size)
}

// renameNoReplace renames from to to, failing with EEXIST if to exists.
func renameNoReplace(from, to string) error {
	return unix.RenameatxNp(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_EXCL)
}
