//go:build !amd64 && !arm64

package sharedbucket

import "unsafe"

// prefetch does nothing on this architecture.
func prefetch(p unsafe.Pointer) {}
