package shmstore

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// OnTmpfs reports whether the table directory is on tmpfs. Elsewhere (a disk
// filesystem) the kernel writes dirty mapped pages back periodically, and a
// store to a page under writeback can wait for the disk: seconds-long stalls
// under I/O pressure were observed with /tmp on ext4.
func (s *Store) OnTmpfs() (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(s.arena.Dir(), &st); err != nil {
		return false, fmt.Errorf("shmstore: %w", err)
	}
	return st.Type == unix.TMPFS_MAGIC, nil
}
