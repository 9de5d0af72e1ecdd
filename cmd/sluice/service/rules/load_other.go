//go:build !unix

package rules

import "os"

// openNonBlocking opens path for reading. Elsewhere than Unix no file
// system path opens a pipe that waits for a writer, so a plain open does.
func openNonBlocking(path string) (*os.File, error) { return os.Open(path) }
