//go:build !linux && !darwin

package shmstore

import (
	"io"

	"github.com/sluice-go/sluice/sharedbucket"
)

// openHeld opens the table at path; sharedbucket supports no other
// platform, so this returns its error.
func openHeld(path string, p sharedbucket.Policy, opts []sharedbucket.Option) (*sharedbucket.Table, io.Closer, error) {
	t, err := sharedbucket.Open(path, p, opts...)
	if err != nil {
		return nil, nil, err
	}
	return t, io.NopCloser(nil), nil
}

// sweep removes nothing: there are no table files on this platform.
func sweep(string, []sharedbucket.Option) int { return 0 }

// release drops the hold; there are no table files on this platform.
func release(h io.Closer, _ string) {
	if h != nil {
		_ = h.Close()
	}
}
