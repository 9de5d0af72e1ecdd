//go:build linux || darwin

package sharedbucket

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DefaultDir returns the default directory for table files: a tmpfs
// directory private to the user, so tables cost no disk writeback and vanish
// at reboot. It is $XDG_RUNTIME_DIR/sluice when XDG_RUNTIME_DIR is set and
// usable, else /dev/shm/sluice-<uid>, else os.TempDir()/sluice-<uid>. It does
// not create the directory; Open and NewArena do (mode 0700) when needed.
func DefaultDir() string {
	uid := strconv.Itoa(os.Geteuid())
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" && filepath.IsAbs(d) && usableDir(d) {
		return filepath.Join(d, "sluice")
	}
	if usableDir("/dev/shm") {
		return "/dev/shm/sluice-" + uid
	}
	return filepath.Join(os.TempDir(), "sluice-"+uid)
}

// usableDir reports whether d is a directory this process may create files in.
func usableDir(d string) bool {
	fi, err := os.Stat(d)
	return err == nil && fi.IsDir() && unix.Access(d, unix.W_OK|unix.X_OK) == nil
}

// errRetry means "the name changed under us; look again".
var errRetry = errors.New("sharedbucket: retry")

// maxOpenAttempts bounds the attach/create loop. Each failed round means
// another process changed the name in between, which cannot go on for ever
// except under an adversary.
const maxOpenAttempts = 64

// Open attaches to the table file at path, or creates it when it does not
// exist. The first process to open a path creates the file with policy p and
// the options' slot count; every later process attaches to it and must ask
// for the same policy (compared in canonical form: T and b) and slot count,
// or gets ErrPolicyMismatch. A file that is not a valid table gives
// ErrCorrupt; a symbolic link, a non-regular file, a file owned by another
// user or writable beyond WithMode's bits is refused. The parent directory is
// created (mode 0700) if it does not exist.
//
// An existing file is never truncated or reinitialised, with one exception:
// a file written before the host's last reboot (its boot id differs) holds
// clock readings that mean nothing now, and is replaced under a lock.
//
// An invalid policy or option is an error naming the bad value. The returned
// Table is safe for concurrent use and must be closed with Close.
func Open(path string, p Policy, opts ...Option) (*Table, error) {
	c, cfg, err := prepare(p, opts)
	if err != nil {
		return nil, err
	}
	if path == "" {
		return nil, errors.New("sharedbucket: Open: empty path")
	}
	slots := roundSlots(cfg.slots)
	if err := ensureDir(filepath.Dir(path)); err != nil {
		return nil, err
	}
	for range maxOpenAttempts {
		t, err := attach(path, p, c, slots, &cfg)
		switch {
		case err == nil:
			return t, nil
		case errors.Is(err, os.ErrNotExist):
			err = create(path, p, c, slots, &cfg)
			if err != nil && !errors.Is(err, errRetry) {
				return nil, err
			}
		case errors.Is(err, errRetry):
		default:
			return nil, err
		}
	}
	return nil, fmt.Errorf("sharedbucket: open %s: the file kept changing under %d attempts", path, maxOpenAttempts)
}

// ensureDir creates dir (0700) if missing and refuses a directory in which
// another user could replace our files: one owned by another user (root
// excepted), or writable by group or others without the sticky bit.
func ensureDir(dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("sharedbucket: %w", err)
		}
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("sharedbucket: stat %s: %w", dir, err)
	}
	euid := uint32(os.Geteuid())
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		// A symbolic link is followed only if we or root made it: in a
		// shared directory (/dev/shm) anyone could plant one.
		if st.Uid != euid && st.Uid != 0 {
			return fmt.Errorf("sharedbucket: %s is a symbolic link owned by uid %d: refused", dir, st.Uid)
		}
		if err := unix.Stat(dir, &st); err != nil {
			return fmt.Errorf("sharedbucket: stat %s: %w", dir, err)
		}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("sharedbucket: %s is not a directory", dir)
	}
	if st.Uid != euid && st.Uid != 0 {
		return fmt.Errorf("sharedbucket: directory %s is owned by uid %d, not %d: refused", dir, st.Uid, euid)
	}
	if st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0 {
		// Anyone who may write the directory may rename or replace the
		// table files in it, whoever owns them; the sticky bit stops that.
		return fmt.Errorf("sharedbucket: directory %s has mode %#o: writable by group or others without the sticky bit, so they could replace table files: refused (chmod go-w %s, or use a private directory)",
			dir, st.Mode&0o7777, dir)
	}
	return nil
}

// attach opens and maps an existing table file. os.ErrNotExist means there
// is none; errRetry means it was replaced while we looked.
func attach(path string, p Policy, c canon, slots int, cfg *config) (*Table, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	switch {
	case err == unix.ENOENT:
		return nil, os.ErrNotExist
	case err == unix.ELOOP:
		return nil, fmt.Errorf("sharedbucket: %s is a symbolic link: refused", path)
	case err != nil:
		return nil, fmt.Errorf("sharedbucket: open %s: %w", path, err)
	}
	// The mapping keeps the file alive; the descriptor is not needed after.
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("sharedbucket: stat %s: %w", path, err)
	}
	if err := checkFile(path, &st, cfg); err != nil {
		return nil, err
	}
	if st.Size < headerSize {
		return nil, fmt.Errorf("sharedbucket: %s: %w: %d bytes, shorter than a header", path, ErrCorrupt, st.Size)
	}
	buf := make([]byte, headerSize)
	if n, err := unix.Pread(fd, buf, 0); err != nil || n != headerSize {
		return nil, fmt.Errorf("sharedbucket: read header of %s: %d bytes, %v", path, n, err)
	}
	h, err := decodeHeader(buf)
	if err != nil {
		return nil, fmt.Errorf("sharedbucket: %s: %w", path, err)
	}
	if h.total != st.Size {
		return nil, fmt.Errorf("sharedbucket: %s: %w: file is %d bytes, header says %d (truncated?)", path, ErrCorrupt, st.Size, h.total)
	}
	if h.clock != clockID {
		return nil, fmt.Errorf("sharedbucket: %s: %w: clock id %d, this platform's is %d", path, ErrCorrupt, h.clock, clockID)
	}
	if st.Blocks*512 < st.Size {
		// A sparse file: touching a hole in the mapping when the filesystem
		// is full is a SIGBUS, so reserve every block now or refuse.
		alloc := allocate
		if allocateHook != nil {
			alloc = allocateHook
		}
		if err := alloc(fd, h.total, true); err != nil {
			return nil, fmt.Errorf("sharedbucket: %s: %w: sparse file (%d of %d bytes allocated) that cannot be allocated: %v",
				path, ErrCorrupt, st.Blocks*512, st.Size, err)
		}
	}
	if boot := bootID(); boot != h.boot && boot != ([16]byte{}) {
		return nil, replaceStale(path, &st, p, c, slots, cfg)
	}
	if h.canon != c || h.slots != slots {
		return nil, fmt.Errorf("sharedbucket: %s: %w: file has %d per %v (%v) in %d slots, asked for %d per %v (%v) in %d slots",
			path, ErrPolicyMismatch, h.limit, h.window, h.canon, h.slots, p.Limit, p.Window, c, slots)
	}
	mem, err := unix.MmapPtr(fd, 0, nil, uintptr(h.total), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("sharedbucket: mmap %s: %w", path, err)
	}
	// Creators killed before publishing leave temporary files; attaching
	// processes clear them too, not only the next creator.
	dir, base := filepath.Split(path)
	sweepTemps(dir, base)
	return newTable(path, mem, h, cfg), nil
}

// checkFile refuses files that another user could have planted or can write.
func checkFile(path string, st *unix.Stat_t, cfg *config) error {
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("sharedbucket: %s is not a regular file: refused", path)
	}
	if euid := uint32(os.Geteuid()); st.Uid != euid {
		return fmt.Errorf("sharedbucket: %s is owned by uid %d, not %d: refused", path, st.Uid, euid)
	}
	if extra := os.FileMode(st.Mode&0o022) &^ cfg.mode; extra != 0 {
		return fmt.Errorf("sharedbucket: %s has mode %#o, writable beyond %#o: refused", path, st.Mode&0o777, cfg.mode)
	}
	return nil
}

// allocateHook, when set (by tests), replaces allocate for an existing
// sparse file.
var allocateHook func(fd int, size int64, existing bool) error

// testHookTempCreated, when set (by tests), runs between a temporary file's
// creation and its builder's lock.
var testHookTempCreated func(tmp string)

// testHookBeforePublish, when set (by tests), runs after a new file is
// complete under its temporary name and before it is published.
var testHookBeforePublish func(tmp string)

// create builds a complete table file under a temporary name and publishes
// it with link(2), which fails if the name exists: racing creators agree on
// one file, readers never see a partial one, and a creator killed before the
// link leaves only a locked temporary file that the next creator removes.
func create(path string, p Policy, c canon, slots int, cfg *config) error {
	dir, base := filepath.Split(path)
	sweepTemps(dir, base)
	tmp, fd, err := buildTemp(dir, base, p, c, slots, cfg)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	defer unix.Unlink(tmp)
	if testHookBeforePublish != nil {
		testHookBeforePublish(tmp)
	}
	err = unix.Link(tmp, path)
	if err == unix.EPERM || err == unix.EOPNOTSUPP || err == unix.ENOSYS {
		// A filesystem without hard links: rename, but never over an
		// existing name (plain rename would replace a live table).
		err = renameNoReplace(tmp, path)
	}
	switch err {
	case nil, unix.EEXIST: // ours, or another creator's: attach to whichever won
		return nil
	case unix.ENOENT: // our temporary file was swept as dead; build again
		return errRetry
	default:
		return fmt.Errorf("sharedbucket: publish %s: %w", path, err)
	}
}

// buildTemp creates, sizes and fills a temporary table file next to the
// final name. The returned descriptor holds an exclusive flock for as long as
// it is open, which is how sweepTemps tells a live builder from a dead one.
func buildTemp(dir, base string, p Policy, c canon, slots int, cfg *config) (string, int, error) {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(dir, "."+base+".tmp-"+hex.EncodeToString(rnd[:]))
	fd, err := unix.Open(tmp, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(cfg.mode))
	if err != nil {
		return "", -1, fmt.Errorf("sharedbucket: create %s: %w", tmp, err)
	}
	fail := func(err error) (string, int, error) {
		unix.Close(fd)
		unix.Unlink(tmp)
		return "", -1, err
	}
	if testHookTempCreated != nil {
		testHookTempCreated(tmp)
	}
	// Why a blocking lock and a re-check: between our create and our lock,
	// another opener sweeping temporary files may lock this one, take it for
	// a dead builder's and unlink it. We wait out its lock, then make sure
	// the name is still ours; if not, build again.
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		return fail(fmt.Errorf("sharedbucket: lock %s: %w", tmp, err))
	}
	var mine, named unix.Stat_t
	if unix.Fstat(fd, &mine) != nil || unix.Lstat(tmp, &named) != nil || mine.Ino != named.Ino || mine.Dev != named.Dev {
		unix.Close(fd)
		return "", -1, errRetry
	}
	if err := unix.Fchmod(fd, uint32(cfg.mode)); err != nil { // the umask may have cut bits
		return fail(fmt.Errorf("sharedbucket: chmod %s: %w", tmp, err))
	}
	h := &header{
		slots:   slots,
		total:   headerSize + int64(slots)*slotSize,
		boot:    bootID(),
		clock:   clockID,
		canon:   c,
		limit:   p.Limit,
		window:  p.Window,
		created: time.Now().UnixNano(),
	}
	var key [32]byte
	if _, err := rand.Read(key[:]); err != nil {
		return fail(fmt.Errorf("sharedbucket: random hash key: %w", err))
	}
	h.k0 = binary.LittleEndian.Uint64(key[0:])
	h.k1 = binary.LittleEndian.Uint64(key[8:])
	copy(h.nonce[:], key[16:])
	// Reserve every block now: a hole in a shared mapping that cannot be
	// filled later (full tmpfs or disk) would be a SIGBUS on the hot path.
	if err := unix.Ftruncate(fd, h.total); err != nil {
		return fail(fmt.Errorf("sharedbucket: size %s: %w", tmp, err))
	}
	if err := allocate(fd, h.total, false); err != nil {
		return fail(fmt.Errorf("sharedbucket: reserve %d bytes for %s: %w", h.total, tmp, err))
	}
	if n, err := unix.Pwrite(fd, h.encode(), 0); err != nil || n != headerSize {
		return fail(fmt.Errorf("sharedbucket: write header of %s: %d bytes, %v", tmp, n, err))
	}
	return tmp, fd, nil
}

// writeZeros writes size zero bytes at the start of a new (private) file, so
// that every block is allocated.
func writeZeros(fd int, size int64) error {
	zeros := make([]byte, 64<<10)
	for off := int64(0); off < size; {
		n, err := unix.Pwrite(fd, zeros[:min(int64(len(zeros)), size-off)], off)
		if err != nil {
			return err
		}
		off += int64(n)
	}
	return nil
}

// sweepTemps removes temporary files of base left by builders that died:
// a live builder holds its file's flock, a dead one's lock is gone.
func sweepTemps(dir, base string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	prefix := "." + base + ".tmp-"
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		name := filepath.Join(dir, e.Name())
		fd, err := unix.Open(name, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		var locked, named unix.Stat_t
		if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) == nil &&
			unix.Fstat(fd, &locked) == nil && unix.Lstat(name, &named) == nil &&
			locked.Ino == named.Ino && locked.Dev == named.Dev {
			unix.Unlink(name)
		}
		unix.Close(fd)
	}
}

// replaceStale replaces a table file from before the last reboot. It holds
// an exclusive flock on a sidecar lock file so that one process replaces it
// and the others then attach to the replacement; it always returns errRetry
// (or a real error) so the caller looks at the name again.
func replaceStale(path string, stale *unix.Stat_t, p Policy, c canon, slots int, cfg *config) error {
	dir, base := filepath.Split(path)
	lock := filepath.Join(dir, "."+base+".lock")
	lfd, err := unix.Open(lock, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(cfg.mode))
	if err != nil {
		return fmt.Errorf("sharedbucket: open lock %s: %w", lock, err)
	}
	defer unix.Close(lfd)
	if err := unix.Flock(lfd, unix.LOCK_EX); err != nil {
		return fmt.Errorf("sharedbucket: lock %s: %w", lock, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil || st.Ino != stale.Ino || st.Dev != stale.Dev {
		return errRetry // already replaced (or removed) by someone else
	}
	tmp, fd, err := buildTemp(dir, base, p, c, slots, cfg)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	// Replacing is right here, and only here: the old file's clock readings
	// are from a previous boot, so nobody alive can be using it correctly.
	if err := unix.Rename(tmp, path); err != nil {
		unix.Unlink(tmp)
		return fmt.Errorf("sharedbucket: replace stale %s: %w", path, err)
	}
	return errRetry
}

// unmapShared replaces the shared mapping at base in place by private
// anonymous memory (see Table.Close).
func unmapShared(base unsafe.Pointer, size uintptr) error {
	_, err := unix.MmapPtr(-1, 0, base, size, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANON|unix.MAP_FIXED)
	return err
}
