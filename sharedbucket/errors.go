package sharedbucket

import "errors"

var (
	// ErrPolicyMismatch is returned (wrapped, with both policies named) when a
	// table file exists with a different policy or slot count than asked for.
	// The existing file is left untouched.
	ErrPolicyMismatch = errors.New("sharedbucket: policy mismatch")

	// ErrCorrupt is returned (wrapped, with the reason) when a file is not a
	// table, has an unknown format version, a damaged header or a size that
	// does not match its header.
	ErrCorrupt = errors.New("sharedbucket: corrupt table file")

	// ErrClosed is returned by Arena.Rate after Arena.Close.
	ErrClosed = errors.New("sharedbucket: closed")
)
