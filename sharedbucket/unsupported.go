//go:build !linux && !darwin

package sharedbucket

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"unsafe"
)

// errUnsupported says where tables work.
var errUnsupported = fmt.Errorf("sharedbucket: shared tables need Linux or macOS, not %s: %w", runtime.GOOS, errors.ErrUnsupported)

// DefaultDir returns os.TempDir()/sluice; tables cannot be opened on this
// platform (see Open).
func DefaultDir() string { return filepath.Join(os.TempDir(), "sluice") }

// Open returns an error wrapping errors.ErrUnsupported: shared tables need
// mmap, flock and link with the semantics of Linux and macOS. An invalid
// policy or option is still reported as such.
func Open(path string, p Policy, opts ...Option) (*Table, error) {
	if _, _, err := prepare(p, opts); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("open %s: %w", path, errUnsupported)
}

func ensureDir(string) error { return errUnsupported }

func unmapShared(unsafe.Pointer, uintptr) error { return nil }

// holderGone never knows here (no table can be opened anyway).
func holderGone(uint64) bool { return false }
