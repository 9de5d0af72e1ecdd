package sharedbucket

import "errors"

var (
	// ErrPolicyMismatch is returned (wrapped, with both policies named) when a
	// table file exists with a different policy or slot count than asked for.
	// The existing file is left untouched.
	ErrPolicyMismatch = errors.New("sharedbucket: policy mismatch")

	// ErrCorrupt is returned (wrapped, with the reason) when a file is not a
	// table, has a damaged header or a size that does not match its header.
	ErrCorrupt = errors.New("sharedbucket: corrupt table file")

	// ErrVersion is returned (wrapped, with both versions and what to do)
	// when a table file was made by another format version of this package:
	// a valid file that this process must not share, since processes of two
	// versions would split each key's limit. To upgrade, stop every process
	// using the file, remove it, and start them all on one version.
	ErrVersion = errors.New("sharedbucket: table file of another format version")

	// ErrClosed is returned by Arena.Rate after Arena.Close.
	ErrClosed = errors.New("sharedbucket: closed")
)
