//go:build unix

package rules

import (
	"os"
	"syscall"
)

// openNonBlocking opens path for reading without blocking: a named pipe
// with no writer opens at once (O_NONBLOCK) instead of waiting for one.
func openNonBlocking(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
}
