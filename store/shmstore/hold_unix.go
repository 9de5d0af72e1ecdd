//go:build linux || darwin

package shmstore

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/sluice-go/sluice/sharedbucket"
)

// The files of a table directory are kept with flock(2) on the table files
// themselves: a Store holds a shared lock on each file it has mapped, for as
// long as it has it mapped, and Open's sweep removes a file only under an
// exclusive lock taken without waiting. The kernel drops a dead process's
// locks, so a crash leaves nothing held.
//
// The directory is locked too, for one reason: a table just created has
// every bucket full, which is what a sweep removes, and its creator can hold
// it only after creating it. So a creator holds a shared lock on the
// directory from before it creates the file until it holds the file, and a
// sweep runs only under an exclusive lock on the directory, taken without
// waiting (a sweep that finds a creation under way skips its turn). Without
// it, stores opening while others sweep could see each new file removed
// before they held it, again and again.

// maxHoldAttempts bounds openHeld's retries; each needs another process to
// remove or replace the file in a window of microseconds.
const maxHoldAttempts = 16

// openHeld opens (creating if need be) the table at path and returns it with
// the open file that holds a shared flock on it, which the caller closes
// after the table.
func openHeld(path string, p sharedbucket.Policy, opts []sharedbucket.Option) (*sharedbucket.Table, io.Closer, error) {
	var creating *os.File // the directory's shared lock, once this call creates the file
	defer func() {
		if creating != nil {
			_ = creating.Close()
		}
	}()
	for range maxHoldAttempts {
		f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, fs.ErrNotExist) {
			if creating == nil {
				if creating, err = lockDir(filepath.Dir(path), unix.LOCK_SH); err != nil {
					return nil, nil, err
				}
			}
			// Create the file, then start over to lock it before mapping
			// it for use. Why not use the table just made: until we hold
			// the lock, a sweep may remove the new file (every bucket of
			// a new table is full), and the table would count alone on a
			// file nobody else can find.
			t, err := sharedbucket.Open(path, p, opts...)
			if err != nil {
				return nil, nil, err
			}
			_ = t.Close()
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		// Blocks only while a sweep checks the file (it holds the
		// exclusive lock for one scan of the table) or its creator builds it.
		if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
			_ = f.Close()
			return nil, nil, fmt.Errorf("flock %s: %w", path, err)
		}
		if same, err := samePath(f, path); err != nil || !same {
			_ = f.Close() // removed or replaced before we held it: again
			continue
		}
		// Held: no sweep can remove or replace path now, so Open maps the
		// file we hold.
		t, err := sharedbucket.Open(path, p, opts...)
		if err != nil {
			_ = f.Close()
			return nil, nil, err
		}
		return t, f, nil
	}
	return nil, nil, fmt.Errorf("open %s: the file kept being removed or replaced (%d attempts)", path, maxHoldAttempts)
}

// lockDir opens dir and takes flock(how) on it; closing the file releases
// the lock.
func lockDir(dir string, how int) (*os.File, error) {
	d, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(d.Fd()), how); err != nil {
		_ = d.Close()
		return nil, fmt.Errorf("flock %s: %w", dir, err)
	}
	return d, nil
}

// samePath reports whether path still names the file f has open.
func samePath(f *os.File, path string) (bool, error) {
	var a, b unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &a); err != nil {
		return false, err
	}
	if err := unix.Lstat(path, &b); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, err
	}
	return a.Dev == b.Dev && a.Ino == b.Ino, nil
}

// sweep removes the table files in dir, named as this package names them,
// that nobody holds and whose every bucket is full, whatever their slot
// count, and returns how many. A file it cannot judge (another format
// version, a file it cannot open) stays.
func sweep(dir string, opts []sharedbucket.Option) int {
	d, err := lockDir(dir, unix.LOCK_EX|unix.LOCK_NB)
	if err != nil {
		return 0 // a table is being created: sweep another time
	}
	defer d.Close()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	removed := 0
	for _, de := range entries {
		id, ok := parseFileName(de.Name())
		if ok && de.Type().IsRegular() && sweepOne(filepath.Join(dir, de.Name()), id, opts) {
			removed++
		}
	}
	return removed
}

func sweepOne(path string, id tableID, opts []sharedbucket.Option) bool {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		return false // held: in use
	}
	if same, err := samePath(f, path); err != nil || !same {
		return false
	}
	t, err := sharedbucket.Open(path, id.policy(), opts...)
	if errors.Is(err, sharedbucket.ErrPolicyMismatch) {
		// Another slot count (the name fixes the policy): a store restarted
		// with more slots, as the eviction warning advises. A file of that
		// count nobody holds and with every bucket full is replaced like any
		// idle table, so the restart is not refused for a table that holds
		// no information. Open it with its own count to judge it.
		t, err = openOtherSlots(f, path, id, opts)
	}
	if err != nil {
		return false // another version, or damaged: not ours to judge
	}
	idle := t.Stats().Keys == 0
	_ = t.Close()
	if !idle {
		return false
	}
	// Open may have replaced a file from before the last reboot: remove
	// only the file we hold.
	if same, err := samePath(f, path); err != nil || !same {
		return false
	}
	return os.Remove(path) == nil
}

// release lets go of a table file this store held (h, from openHeld) after
// its table was closed: it removes the file at path if no other process
// holds it, then drops the hold. Why an exclusive lock taken without
// waiting: any other Store that maps the file holds a shared lock on it,
// so getting the exclusive one proves nobody does; an opener that has the
// file open but not yet locked finds it gone once locked (openHeld checks
// samePath) and starts over.
func release(h io.Closer, path string) {
	f, ok := h.(*os.File)
	if !ok {
		return
	}
	defer f.Close()
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		return // another process holds it: the file stays for it
	}
	if same, err := samePath(f, path); err == nil && same {
		_ = os.Remove(path)
	}
}

// openOtherSlots opens the table f holds at path with the slot count its
// size gives (16 bytes a slot after a header smaller than the slots, a power
// of two), or the half of it. A wrong guess is refused by sharedbucket.Open,
// never used: the header names the count.
func openOtherSlots(f *os.File, path string, id tableID, opts []sharedbucket.Option) (*sharedbucket.Table, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	n := 1
	for n*2 <= sharedbucket.MaxSlots && int64(n*2)*16 <= fi.Size() {
		n *= 2
	}
	err = sharedbucket.ErrPolicyMismatch
	for _, slots := range []int{n, n / 2} {
		if slots < 1 {
			continue
		}
		var t *sharedbucket.Table
		t, err = sharedbucket.Open(path, id.policy(), append(opts[:len(opts):len(opts)], sharedbucket.WithSlots(slots))...)
		if err == nil {
			return t, nil
		}
	}
	return nil, err
}
