package sharedbucket

import (
	"fmt"
	"path/filepath"
	"sync"
)

// Arena is a directory of named tables, one file per name: each name is one
// policy (a login limit, an API limit), and every process that asks an
// Arena on the same directory for the same name shares that table.
//
// An Arena is safe for concurrent use. Its zero value is not usable: get one
// from NewArena. Close closes every table it returned.
type Arena struct {
	dir string

	mu     sync.Mutex
	tables map[string]*Table // open tables by name; guarded by mu
	closed bool              // guarded by mu
}

// TableExt is the file name extension of an Arena's tables.
const TableExt = ".sbt"

// NewArena returns an Arena on dir, creating it (mode 0700) if it does not
// exist. An empty dir means DefaultDir(). A directory owned by another user,
// or writable by others without the sticky bit, is refused.
func NewArena(dir string) (*Arena, error) {
	if dir == "" {
		dir = DefaultDir()
	}
	if err := ensureDir(dir); err != nil {
		return nil, err
	}
	return &Arena{dir: dir, tables: make(map[string]*Table)}, nil
}

// Dir returns the Arena's directory.
func (a *Arena) Dir() string { return a.dir }

// Rate returns the table called name, creating its file (dir/name.sbt) if
// no process has yet, with Open's rules: asking for a name that exists with
// another policy or slot count is refused with ErrPolicyMismatch rather
// than silently counting against somebody else's numbers. Within one Arena,
// asking again for an open name returns the same *Table (with the per-handle
// options, WithFailMode and WithCoarseClock, of the call that opened it).
//
// A name is 1 to 128 bytes of ASCII letters, digits, '-', '_' and '.', not
// starting with '.'.
func (a *Arena) Rate(name string, p Policy, opts ...Option) (*Table, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, ErrClosed
	}
	if t, ok := a.tables[name]; ok && !t.closed.Load() {
		c, cfg, err := prepare(p, opts)
		if err != nil {
			return nil, err
		}
		if c != (canon{interval: t.interval, burst: t.burst}) || roundSlots(cfg.slots) != t.nslots {
			return nil, fmt.Errorf("sharedbucket: arena %s: %q: %w: open as %v in %d slots, asked for %v in %d slots",
				a.dir, name, ErrPolicyMismatch, canon{t.interval, t.burst}, t.nslots, c, roundSlots(cfg.slots))
		}
		return t, nil
	}
	t, err := Open(filepath.Join(a.dir, name+TableExt), p, opts...)
	if err != nil {
		return nil, err
	}
	a.tables[name] = t
	return t, nil
}

// Close closes every table the Arena returned; later Rate calls return
// ErrClosed. It returns the first error.
func (a *Arena) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	var first error
	for name, t := range a.tables {
		if err := t.Close(); err != nil && first == nil {
			first = err
		}
		delete(a.tables, name)
	}
	return first
}

// validName checks a table name. Why narrower than a policy name (printable
// ASCII, internal/limitresponse.CheckName): the name is a file name, so
// '/', leading dots and spaces are out; every valid table name is a valid
// policy name, which TestTableNamesArePolicyNames holds.
func validName(name string) error {
	if len(name) == 0 || len(name) > 128 || name[0] == '.' {
		return fmt.Errorf("sharedbucket: table name %q: want 1 to 128 bytes, not starting with '.'", name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("sharedbucket: table name %q: byte %q not allowed (letters, digits, '-', '_', '.')", name, c)
		}
	}
	return nil
}
