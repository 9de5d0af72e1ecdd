package sharedbucket

import "golang.org/x/sys/unix"

// allocate reserves every block of the file's first size bytes. fallocate
// with mode 0 fills holes and leaves existing data alone, so it is safe on a
// live file (existing). Without fallocate (some filesystems), a new file is
// filled with zeros instead, and an existing sparse file cannot be filled
// safely (another process may be writing into the hole).
func allocate(fd int, size int64, existing bool) error {
	err := unix.Fallocate(fd, 0, 0, size)
	if (err == unix.EOPNOTSUPP || err == unix.ENOSYS) && !existing {
		return writeZeros(fd, size)
	}
	return err
}

// renameNoReplace renames from to to, failing with EEXIST if to exists.
func renameNoReplace(from, to string) error {
	return unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE)
}
