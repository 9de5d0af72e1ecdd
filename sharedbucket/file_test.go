//go:build linux || darwin

package sharedbucket

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

var fileP = Policy{Limit: 10, Window: time.Second}

func readHeaderFile(t *testing.T, path string) *header {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	h, err := decodeHeader(raw)
	require.NoError(t, err)
	return h
}

// entries lists dir's names.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func TestAttachSharesState(t *testing.T) {
	path := filepath.Join(tmpfsDir(t), "s.sbt")
	a, err := Open(path, fileP)
	require.NoError(t, err)
	defer a.Close()
	b, err := Open(path, fileP)
	require.NoError(t, err)
	defer b.Close()
	assert.Equal(t, a.nonce, b.nonce)
	require.True(t, a.AllowAt("k", 4, t0))
	assert.Equal(t, 6.0, b.RemainingAt("k", t0))
	require.True(t, b.AllowAt("k", 6, t0))
	assert.False(t, a.AllowAt("k", 1, t0))
	assert.Equal(t, []string{"s.sbt"}, entries(t, filepath.Dir(path)), "no temporary file left")
	assert.Equal(t, path, a.Path())
	assert.Equal(t, Policy{Limit: 10, Window: time.Second, Burst: 10}, a.Policy())
}

func TestCreatedFile(t *testing.T) {
	old := unix.Umask(0o077)
	defer unix.Umask(old)
	dir := tmpfsDir(t)
	a, err := Open(filepath.Join(dir, "a.sbt"), fileP, WithSlots(1000))
	require.NoError(t, err)
	defer a.Close()
	var st unix.Stat_t
	require.NoError(t, unix.Stat(filepath.Join(dir, "a.sbt"), &st))
	assert.Equal(t, uint32(0o600), st.Mode&0o7777)
	assert.EqualValues(t, headerSize+1024*slotSize, st.Size)
	assert.GreaterOrEqual(t, st.Blocks*512, st.Size, "every block reserved up front (fallocate)")

	b, err := Open(filepath.Join(dir, "b.sbt"), fileP, WithMode(0o660))
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, unix.Stat(filepath.Join(dir, "b.sbt"), &st))
	assert.Equal(t, uint32(0o660), st.Mode&0o7777, "the umask does not cut the asked mode")
	_, err = Open(filepath.Join(dir, "b.sbt"), fileP)
	assert.ErrorContains(t, err, "writable beyond", "a 0600 handle refuses a group-writable file")
	c, err := Open(filepath.Join(dir, "b.sbt"), fileP, WithMode(0o660))
	require.NoError(t, err)
	c.Close()
}

func TestPolicyMismatch(t *testing.T) {
	path := filepath.Join(tmpfsDir(t), "m.sbt")
	a, err := Open(path, fileP, WithSlots(64))
	require.NoError(t, err)
	defer a.Close()
	require.True(t, a.AllowAt("k", 3, t0))

	for _, tc := range []struct {
		p    Policy
		opts []Option
	}{
		{Policy{Limit: 20, Window: time.Second}, []Option{WithSlots(64)}},
		{Policy{Limit: 10, Window: time.Second, Burst: 5}, []Option{WithSlots(64)}},
		{Policy{Limit: 10, Window: 2 * time.Second, Burst: 10}, []Option{WithSlots(64)}},
		{fileP, nil}, // default slot count
		{fileP, []Option{WithSlots(128)}},
	} {
		_, err := Open(path, tc.p, tc.opts...)
		require.ErrorIs(t, err, ErrPolicyMismatch, "%+v", tc.p)
		assert.Contains(t, err.Error(), "file has 10 per 1s")
	}
	// The same canonical policy spelled differently is the same policy.
	b, err := Open(path, Policy{Limit: 100, Window: 10 * time.Second, Burst: 10}, WithSlots(50))
	require.NoError(t, err)
	defer b.Close()
	assert.Equal(t, 7.0, b.RemainingAt("k", t0), "refusals left the live file alone")
}

// corruptCopy writes a valid table file at path and then lets f damage it.
func corruptCase(t *testing.T, f func(path string)) error {
	t.Helper()
	path := filepath.Join(tmpfsDir(t), "c.sbt")
	tb, err := Open(path, fileP, WithSlots(8))
	require.NoError(t, err)
	require.NoError(t, tb.Close())
	f(path)
	before, err := os.ReadFile(path)
	require.NoError(t, err)
	_, err = Open(path, fileP, WithSlots(8))
	after, rerr := os.ReadFile(path)
	require.NoError(t, rerr)
	assert.Equal(t, before, after, "a refused file is never modified")
	return err
}

func patch(t *testing.T, path string, off int64, b []byte) {
	t.Helper()
	fd, err := os.OpenFile(path, os.O_RDWR, 0)
	require.NoError(t, err)
	_, err = fd.WriteAt(b, off)
	require.NoError(t, err)
	require.NoError(t, fd.Close())
}

// flip inverts every bit of the byte at off, so the file always changes
// (writing a fixed value does nothing when the byte already holds it, as a
// checksum byte does one time in 256).
func flip(t *testing.T, path string, off int64) {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	patch(t, path, off, []byte{^raw[off]})
}

// rewrite returns a damage that sets header words (offset → value) and
// recomputes the header checksum, as a writer of another version would.
func rewrite(words map[int]uint64) func(t *testing.T, path string) {
	return func(t *testing.T, path string) {
		raw, err := os.ReadFile(path)
		require.NoError(t, err)
		for off, v := range words {
			binary.LittleEndian.PutUint64(raw[off:], v)
		}
		binary.LittleEndian.PutUint32(raw[crcOffset:], crc32.Checksum(raw[:crcOffset], castagnoli))
		require.NoError(t, os.WriteFile(path, raw, 0o600))
	}
}

func TestCorrupt(t *testing.T) {
	for name, tc := range map[string]struct {
		damage func(t *testing.T, path string)
		want   string
	}{
		"flipped policy byte":           {func(t *testing.T, p string) { flip(t, p, 90) }, "checksum"},
		"flipped crc byte":              {func(t *testing.T, p string) { flip(t, p, crcOffset) }, "checksum"},
		"bad magic":                     {func(t *testing.T, p string) { patch(t, p, 0, []byte("NOTATABL")) }, "magic"},
		"truncated":                     {func(t *testing.T, p string) { require.NoError(t, os.Truncate(p, headerSize+64)) }, "truncated"},
		"shorter than header":           {func(t *testing.T, p string) { require.NoError(t, os.Truncate(p, 100)) }, "shorter than a header"},
		"empty":                         {func(t *testing.T, p string) { require.NoError(t, os.Truncate(p, 0)) }, "shorter than a header"},
		"version 4 with the SipHash id": {rewrite(map[int]uint64{120: 1}), "hash id 1"},
		"bad slot count":                {rewrite(map[int]uint64{32: 12}), "slot count 12"},
	} {
		t.Run(name, func(t *testing.T) {
			err := corruptCase(t, func(p string) { tc.damage(t, p) })
			require.ErrorIs(t, err, ErrCorrupt)
			assert.NotErrorIs(t, err, ErrVersion)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestOtherVersion: a valid file of another format version is refused with
// ErrVersion (not ErrCorrupt: nothing is damaged), with both versions and
// what to do, and left untouched.
func TestOtherVersion(t *testing.T) {
	for name, tc := range map[string]struct {
		damage func(t *testing.T, path string)
		want   string
	}{
		"future version": {rewrite(map[int]uint64{8: formatVersion + 1}),
			"format version 5, this code reads 4: a table made by a newer version; run every process that shares it on one version"},
		// A version 3 file: its lock words name the old owner, not a time,
		// so its processes and these would wait on each other's locks for
		// ever or take them over at once.
		"version 3 (owner locks)": {rewrite(map[int]uint64{8: 3}),
			"format version 3, this code reads 4: a table made by an older version, whose processes hash keys or lock slots differently; " +
				"stop every process using it, remove the file, and run them all on this version"},
		// A version 2 file (SipHash-1-3, hash id 1): its processes put keys
		// elsewhere, so sharing it would split every key's limit.
		"version 2 (SipHash)": {rewrite(map[int]uint64{8: 2, 120: 1}), "format version 2, this code reads 4: a table made by an older version"},
		"version 1":           {rewrite(map[int]uint64{8: 1}), "format version 1, this code reads 4"},
	} {
		t.Run(name, func(t *testing.T) {
			err := corruptCase(t, func(p string) { tc.damage(t, p) })
			require.ErrorIs(t, err, ErrVersion)
			assert.NotErrorIs(t, err, ErrCorrupt)
			assert.Contains(t, err.Error(), tc.want)
			assert.Contains(t, err.Error(), "c.sbt", "the error names the file")
		})
	}
}

func TestRefusals(t *testing.T) {
	dir := tmpfsDir(t)
	real := filepath.Join(dir, "real.sbt")
	tb, err := Open(real, fileP)
	require.NoError(t, err)
	tb.Close()

	require.NoError(t, os.Symlink(real, filepath.Join(dir, "link.sbt")))
	_, err = Open(filepath.Join(dir, "link.sbt"), fileP)
	assert.ErrorContains(t, err, "symbolic link")

	require.NoError(t, os.Mkdir(filepath.Join(dir, "adir"), 0o700))
	_, err = Open(filepath.Join(dir, "adir"), fileP)
	assert.ErrorContains(t, err, "is a directory")

	require.NoError(t, os.Chmod(real, 0o666))
	_, err = Open(real, fileP)
	assert.ErrorContains(t, err, "writable beyond")
	require.NoError(t, os.Chmod(real, 0o600))

	if os.Geteuid() != 0 {
		t.Log("not root: cannot hand files to another user; ownership checks not exercised")
		return
	}
	require.NoError(t, os.Chown(real, 4242, 4242))
	_, err = Open(real, fileP)
	assert.ErrorContains(t, err, "owned by uid 4242")

	other := filepath.Join(dir, "other")
	require.NoError(t, os.Mkdir(other, 0o755))
	require.NoError(t, os.Chown(other, 4242, 4242))
	_, err = Open(filepath.Join(other, "x.sbt"), fileP)
	assert.ErrorContains(t, err, "owned by uid 4242")
	_, err = NewArena(other)
	assert.ErrorContains(t, err, "owned by uid 4242")

	// A symbolic link to a directory, planted by another user, is refused;
	// one of our own is followed.
	mine := filepath.Join(dir, "mine")
	require.NoError(t, os.Mkdir(mine, 0o700))
	planted := filepath.Join(dir, "planted")
	require.NoError(t, os.Symlink(mine, planted))
	require.NoError(t, os.Lchown(planted, 4242, 4242))
	_, err = Open(filepath.Join(planted, "x.sbt"), fileP)
	assert.ErrorContains(t, err, "symbolic link owned by uid 4242")
	ours := filepath.Join(dir, "ours")
	require.NoError(t, os.Symlink(mine, ours))
	tb, err = Open(filepath.Join(ours, "x.sbt"), fileP)
	require.NoError(t, err)
	tb.Close()
}

func TestOpenCreatesDir(t *testing.T) {
	dir := filepath.Join(tmpfsDir(t), "a", "b")
	tb, err := Open(filepath.Join(dir, "x.sbt"), fileP)
	require.NoError(t, err)
	defer tb.Close()
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm())
	_, err = Open("", fileP)
	assert.Error(t, err)
}

func TestDefaultDir(t *testing.T) {
	uid := strconv.Itoa(os.Geteuid())
	xdg := t.TempDir()
	t.Setenv("XDG_RUNTIME_DIR", xdg)
	assert.Equal(t, filepath.Join(xdg, "sluice"), DefaultDir())

	t.Setenv("XDG_RUNTIME_DIR", "relative/dir")
	fallback := DefaultDir()
	t.Setenv("XDG_RUNTIME_DIR", "/nonexistent-"+uid)
	assert.Equal(t, fallback, DefaultDir())
	t.Setenv("XDG_RUNTIME_DIR", "")
	assert.Equal(t, fallback, DefaultDir())
	if usableDir("/dev/shm") {
		assert.Equal(t, "/dev/shm/sluice-"+uid, fallback)
	} else {
		assert.Equal(t, filepath.Join(os.TempDir(), "sluice-"+uid), fallback)
	}

	// NewArena("") uses it and creates it 0700.
	t.Setenv("XDG_RUNTIME_DIR", xdg)
	a, err := NewArena("")
	require.NoError(t, err)
	defer a.Close()
	assert.Equal(t, filepath.Join(xdg, "sluice"), a.Dir())
	fi, err := os.Stat(a.Dir())
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm())
}

// TestStaleBootReplaced: a file whose boot id is not this boot's holds
// CLOCK_MONOTONIC readings from another uptime; it is replaced, not trusted.
func TestStaleBootReplaced(t *testing.T) {
	if bootID() == ([16]byte{}) {
		t.Skip("no boot identity: reboots cannot be detected here")
	}
	dir := tmpfsDir(t)
	path := filepath.Join(dir, "b.sbt")
	old, err := Open(path, fileP, WithSlots(8))
	require.NoError(t, err)
	// The previous uptime left a key deep in debt, far ahead of our clock.
	require.True(t, old.AllowN("k", 10))
	slotAt(old.slots, old.hk.hash("k")&old.mask).tat.Store(Now() + int64(time.Hour))
	oldNonce := old.nonce
	require.NoError(t, old.Close())

	h := readHeaderFile(t, path)
	h.boot[0] ^= 0xff
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	copy(raw, h.encode())
	require.NoError(t, os.WriteFile(path, raw, 0o600))

	tb, err := Open(path, fileP, WithSlots(8))
	require.NoError(t, err)
	defer tb.Close()
	assert.NotEqual(t, oldNonce, tb.nonce, "a new file")
	assert.Equal(t, bootID(), readHeaderFile(t, path).boot)
	assert.Equal(t, 10.0, tb.Remaining("k"))
	assert.ElementsMatch(t, []string{"b.sbt", ".b.sbt.lock"}, entries(t, dir))
}

func TestSweepDeadTemp(t *testing.T) {
	dir := tmpfsDir(t)
	dead := filepath.Join(dir, ".x.sbt.tmp-00dead00")
	require.NoError(t, os.WriteFile(dead, []byte("half-built"), 0o600))
	live := filepath.Join(dir, ".x.sbt.tmp-11a11e11")
	fd, err := unix.Open(live, unix.O_RDWR|unix.O_CREAT, 0o600)
	require.NoError(t, err)
	defer unix.Close(fd)
	require.NoError(t, unix.Flock(fd, unix.LOCK_EX))

	tb, err := Open(filepath.Join(dir, "x.sbt"), fileP)
	require.NoError(t, err)
	defer tb.Close()
	assert.ElementsMatch(t, []string{"x.sbt", ".x.sbt.tmp-11a11e11"}, entries(t, dir),
		"the dead builder's file is gone, the live builder's (locked) is kept")
}

func TestCloseUnderLoad(t *testing.T) {
	tb, err := Open(filepath.Join(tmpfsDir(t), "l.sbt"), neverDeny)
	require.NoError(t, err)
	done := make(chan int)
	for g := range 2 {
		go func() {
			n := 0
			bk := tb.Bucket("k" + strconv.Itoa(g))
			for tb.Allow("x") && bk.AllowN(1) {
				n++
			}
			done <- n
		}()
	}
	for !(tb.Stats().Allowed > 1000) {
		runtime.Gosched()
	}
	require.NoError(t, tb.Close())
	<-done
	<-done
	assert.False(t, tb.Allow("x"))
}

// FuzzDecodeHeader: any first page either decodes to a header whose
// numbers are safe to map and compute with, or is ErrCorrupt (ErrVersion
// for another format version); never a panic.
func FuzzDecodeHeader(f *testing.F) {
	good := (&header{slots: 64, total: headerSize + 64*slotSize, canon: canon{interval: 1e6, burst: 10},
		limit: 1000, window: time.Second, k0: 1, k1: 2}).encode()
	f.Add(good)
	f.Add(good[:100])
	f.Add(make([]byte, headerSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := decodeHeader(b)
		if err != nil {
			if !errors.Is(err, ErrVersion) {
				require.ErrorIs(t, err, ErrCorrupt)
			}
			return
		}
		require.Equal(t, headerSize+int64(h.slots)*slotSize, h.total)
		require.Zero(t, h.slots&(h.slots-1))
		require.GreaterOrEqual(t, h.canon.interval, int64(1))
		require.GreaterOrEqual(t, h.canon.burst, int64(1))
		require.Less(t, h.canon.tau(), maxTau)
	})
}

// TestRacingCreators: 32 goroutines open one fresh path at once, round
// after round; every Open succeeds, all agree on one file, and no temporary
// file is left: another creator's sweep must not lock a new temporary
// file before its owner does (the owner's Open would fail with "resource
// temporarily unavailable").
func TestRacingCreators(t *testing.T) {
	const goroutines, rounds = 32, 100
	dir := tmpfsDir(t)
	for r := range rounds {
		path := filepath.Join(dir, "r"+strconv.Itoa(r)+".sbt")
		nonces := make([][16]byte, goroutines)
		errs := make([]error, goroutines)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := range goroutines {
			wg.Go(func() {
				<-start
				tb, err := Open(path, fileP, WithSlots(64))
				if errs[g] = err; err == nil {
					nonces[g] = tb.nonce
					tb.Close()
				}
			})
		}
		close(start)
		wg.Wait()
		for g := range goroutines {
			require.NoError(t, errs[g], "round %d goroutine %d", r, g)
			require.Equal(t, nonces[0], nonces[g], "round %d: goroutines disagree on the file", r)
		}
	}
	assert.Len(t, entries(t, dir), rounds, "one file per round and no temporary file")
}

// TestSweepBeforeOwnerLocks makes the race of TestRacingCreators certain:
// another opener's sweep locks a new temporary file before its builder
// does (and, finding it unlocked, takes it for dead and removes it). The
// builder waits out that lock, sees its file gone and builds again.
func TestSweepBeforeOwnerLocks(t *testing.T) {
	dir := tmpfsDir(t)
	var once sync.Once
	swept := make(chan struct{})
	testHookTempCreated = func(tmp string) {
		once.Do(func() {
			fd, err := unix.Open(tmp, unix.O_RDWR, 0)
			require.NoError(t, err)
			require.NoError(t, unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB))
			go func() { // the sweeper finishes while the builder waits
				defer close(swept)
				unix.Unlink(tmp)
				unix.Close(fd)
			}()
		})
	}
	defer func() { testHookTempCreated = nil }()
	tb, err := Open(filepath.Join(dir, "x.sbt"), fileP)
	<-swept
	require.NoError(t, err)
	defer tb.Close()
	assert.True(t, tb.Allow("k"))
	assert.Equal(t, []string{"x.sbt"}, entries(t, dir))
}

// TestSweepOnAttach: temporary files left by killed creators are removed
// by a process that attaches to the existing table, not only by the next
// creator.
func TestSweepOnAttach(t *testing.T) {
	dir := tmpfsDir(t)
	path := filepath.Join(dir, "a.sbt")
	tb, err := Open(path, fileP)
	require.NoError(t, err)
	defer tb.Close()
	for i := range 5 {
		require.NoError(t, os.WriteFile(filepath.Join(dir, ".a.sbt.tmp-dead"+strconv.Itoa(i)), []byte("x"), 0o600))
	}
	again, err := Open(path, fileP)
	require.NoError(t, err)
	defer again.Close()
	assert.Equal(t, []string{"a.sbt"}, entries(t, dir))
}

// TestDirWritableByOthers: a directory writable by group or others without
// the sticky bit is refused, even our own, with the mode and the fix named.
func TestDirWritableByOthers(t *testing.T) {
	for _, mode := range []os.FileMode{0o777, 0o757, 0o770} {
		dir := filepath.Join(tmpfsDir(t), "d")
		require.NoError(t, os.Mkdir(dir, 0o700))
		require.NoError(t, os.Chmod(dir, mode))
		_, err := NewArena(dir)
		require.Error(t, err, "mode %o", mode)
		assert.ErrorContains(t, err, fmt.Sprintf("mode %#o", mode))
		assert.ErrorContains(t, err, "chmod go-w "+dir)
		_, err = Open(filepath.Join(dir, "x.sbt"), fileP)
		assert.Error(t, err)
	}
	dir := filepath.Join(tmpfsDir(t), "sticky")
	require.NoError(t, os.Mkdir(dir, 0o700))
	require.NoError(t, os.Chmod(dir, 0o777|os.ModeSticky))
	a, err := NewArena(dir)
	require.NoError(t, err, "the sticky bit stops others replacing our files")
	require.NoError(t, a.Close())
}
