//go:build !linux

package shmstore

import (
	"errors"
	"fmt"
)

// OnTmpfs reports whether the table directory is on tmpfs. Only Linux can
// tell; elsewhere it returns an error wrapping errors.ErrUnsupported.
func (s *Store) OnTmpfs() (bool, error) {
	return false, fmt.Errorf("shmstore: tmpfs check: %w", errors.ErrUnsupported)
}
