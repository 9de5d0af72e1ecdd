// Command modproxy writes a file-based Go module proxy (GOPROXY=file://DIR)
// serving modules of this checkout at the versions their go.mod files name,
// as the real proxy would serve them once the tags of RELEASING.md exist.
//
//	go run . -out DIR -version v0.1.0 -module PATH=DIR [-module PATH=DIR ...]
//
// Each module gets the files a proxy serves: @v/list, @v/VERSION.info,
// @v/VERSION.mod and @v/VERSION.zip (made with golang.org/x/mod/zip from the
// files git knows in DIR: tracked and untracked but not ignored, so a build
// directory's leftovers never enter a zip; nested modules are left out, as
// the go command leaves them out).
//
// Modules are written in the order given, as RELEASING.md tags them: when a
// later module requires an earlier one at VERSION, the later module's go.sum
// in the zip gets the earlier one's lines, as the release's `go get` writes
// them before the second tag. It prints those lines.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/sumdb/dirhash"
	"golang.org/x/mod/zip"
)

type modules []string

func (m *modules) String() string     { return strings.Join(*m, ",") }
func (m *modules) Set(s string) error { *m = append(*m, s); return nil }

func main() {
	out := flag.String("out", "", "directory to write the proxy into")
	version := flag.String("version", "", "the version every module is served at, e.g. v0.1.0")
	var mods modules
	flag.Var(&mods, "module", "PATH=DIR, repeatable, in release order")
	flag.Parse()
	if *out == "" || *version == "" || len(mods) == 0 || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*out, *version, mods); err != nil {
		fmt.Fprintln(os.Stderr, "modproxy:", err)
		os.Exit(1)
	}
}

func run(out, version string, mods []string) error {
	if module.CanonicalVersion(version) != version {
		return fmt.Errorf("version %q is not a canonical semantic version", version)
	}
	sums := map[string][]string{} // module path -> its go.sum lines at version
	for _, spec := range mods {
		modPath, dir, ok := strings.Cut(spec, "=")
		if !ok {
			return fmt.Errorf("-module %q: want PATH=DIR", spec)
		}
		lines, err := write(out, module.Version{Path: modPath, Version: version}, dir, sums)
		if err != nil {
			return fmt.Errorf("%s: %w", modPath, err)
		}
		sums[modPath] = lines
		for _, l := range lines {
			fmt.Println(l)
		}
	}
	return nil
}

// write serves m from dir under out and returns m's go.sum lines.
func write(out string, m module.Version, dir string, sums map[string][]string) ([]string, error) {
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return nil, err
	}
	mf, err := modfile.ParseLax("go.mod", gomod, nil)
	if err != nil {
		return nil, err
	}
	if mf.Module == nil || mf.Module.Mod.Path != m.Path {
		return nil, fmt.Errorf("%s/go.mod does not declare module %s", dir, m.Path)
	}
	// What the release adds to go.sum before tagging this module: the lines
	// of each module already tagged that this one requires at m.Version.
	var extra []string
	replaced := map[string]bool{}
	for _, r := range mf.Require {
		if l, ok := sums[r.Mod.Path]; ok && r.Mod.Version == m.Version {
			extra = append(extra, l...)
			replaced[r.Mod.Path] = true
		}
	}
	files, err := gitFiles(dir)
	if err != nil {
		return nil, err
	}
	if len(extra) > 0 {
		files, err = withSums(files, dir, m.Version, replaced, extra)
		if err != nil {
			return nil, err
		}
	}

	esc, err := module.EscapePath(m.Path)
	if err != nil {
		return nil, err
	}
	vdir := filepath.Join(out, filepath.FromSlash(esc), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return nil, err
	}
	base := filepath.Join(vdir, m.Version)
	info, _ := json.Marshal(struct {
		Version string
		Time    time.Time
	}{m.Version, time.Now().UTC().Truncate(time.Second)})
	if err := os.WriteFile(base+".info", info, 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(base+".mod", gomod, 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(vdir, "list"), []byte(m.Version+"\n"), 0o644); err != nil {
		return nil, err
	}
	zf, err := os.Create(base + ".zip")
	if err != nil {
		return nil, err
	}
	if err := zip.Create(zf, m, files); err != nil {
		zf.Close()
		return nil, err
	}
	if err := zf.Close(); err != nil {
		return nil, err
	}

	// go.sum lines, as the go command computes them.
	zh, err := dirhash.HashZip(base+".zip", dirhash.Hash1)
	if err != nil {
		return nil, err
	}
	mh, err := dirhash.Hash1([]string{"go.mod"}, func(string) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(gomod)), nil
	})
	if err != nil {
		return nil, err
	}
	return []string{
		fmt.Sprintf("%s %s %s", m.Path, m.Version, zh),
		fmt.Sprintf("%s %s/go.mod %s", m.Path, m.Version, mh),
	}, nil
}

// gitFiles lists the files git knows in dir (tracked, or untracked and not
// ignored), leaving out nested modules and files deleted from the tree.
func gitFiles(dir string) ([]zip.File, error) {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = dir
	cmd.Stderr = os.Stderr
	b, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files in %s: %w", dir, err)
	}
	var names []string
	nested := map[string]bool{} // directories holding a go.mod of their own
	for _, n := range strings.Split(string(b), "\x00") {
		if n == "" {
			continue
		}
		names = append(names, n)
		if path.Base(n) == "go.mod" && path.Dir(n) != "." {
			nested[path.Dir(n)] = true
		}
	}
	var files []zip.File
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] || inNested(n, nested) {
			continue
		}
		seen[n] = true
		fi, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(n)))
		if err != nil {
			if os.IsNotExist(err) {
				continue // deleted in the work tree
			}
			return nil, err
		}
		files = append(files, file{slash: n, path: filepath.Join(dir, filepath.FromSlash(n)), info: fi})
	}
	return files, nil
}

func inNested(n string, nested map[string]bool) bool {
	for d := path.Dir(n); d != "." && d != "/"; d = path.Dir(d) {
		if nested[d] {
			return true
		}
	}
	return false
}

// withSums replaces go.sum in files with dir's go.sum plus extra lines. The
// lines dir's go.sum holds for the replaced modules at version are dropped:
// after a release they hash the released zips, not this checkout's.
func withSums(files []zip.File, dir, version string, replaced map[string]bool, extra []string) ([]zip.File, error) {
	old, err := os.ReadFile(filepath.Join(dir, "go.sum"))
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	have := map[string]bool{}
	var buf bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(old))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 3 && replaced[f[0]] && strings.TrimSuffix(f[1], "/go.mod") == version {
			continue
		}
		have[sc.Text()] = true
		buf.WriteString(sc.Text() + "\n")
	}
	for _, l := range extra {
		if !have[l] {
			buf.WriteString(l + "\n")
		}
	}
	kept := files[:0]
	for _, f := range files {
		if f.Path() != "go.sum" {
			kept = append(kept, f)
		}
	}
	return append(kept, data{name: "go.sum", b: buf.Bytes()}), nil
}

type file struct {
	slash, path string
	info        fs.FileInfo
}

func (f file) Path() string                 { return f.slash }
func (f file) Lstat() (fs.FileInfo, error)  { return f.info, nil }
func (f file) Open() (io.ReadCloser, error) { return os.Open(f.path) }

type data struct {
	name string
	b    []byte
}

func (d data) Path() string                 { return d.name }
func (d data) Lstat() (fs.FileInfo, error)  { return dataInfo(d), nil }
func (d data) Open() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(d.b)), nil }

type dataInfo data

func (i dataInfo) Name() string       { return path.Base(i.name) }
func (i dataInfo) Size() int64        { return int64(len(i.b)) }
func (i dataInfo) Mode() fs.FileMode  { return 0o644 }
func (i dataInfo) ModTime() time.Time { return time.Time{} }
func (i dataInfo) IsDir() bool        { return false }
func (i dataInfo) Sys() any           { return nil }
