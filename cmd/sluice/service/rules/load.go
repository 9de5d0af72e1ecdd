package rules

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Options change how ParseAll and LoadAll combine files. The zero value
// refuses a domain configured twice.
type Options struct {
	// MergeDomains lets several files (or documents) configure one domain,
	// as envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG: a later file's
	// descriptors join the domain's top level, after the earlier ones (so
	// an earlier wildcard is tried first). A key and value the domain
	// already has at its top level is refused as configured twice, even
	// when the nested descriptors differ: the merge is of top-level
	// descriptors, not of trees.
	MergeDomains bool
}

// Source is one rules file: its name (for errors) and contents.
type Source struct {
	Name string
	Data []byte
}

// LoadAll reads the rules at paths, each a file or a directory, and parses
// them together (ParseAll). A directory stands for every *.yaml and *.yml
// file directly in it, in name order (see Expand). Every file is read
// before any is parsed, and an error in any file fails the whole load: a
// caller that keeps its rules in force on error never runs on part of a
// directory.
func LoadAll(paths []string, opt Options) (*Config, error) {
	files, err := Expand(paths)
	if err != nil {
		return nil, err
	}
	srcs := make([]Source, len(files))
	for i, f := range files {
		data, err := readCapped(f)
		if err != nil {
			return nil, err
		}
		srcs[i] = Source{Name: f, Data: data}
	}
	return ParseAll(srcs, opt)
}

// Expand lists the files LoadAll reads for paths, in the order it reads
// them: a file as given; for a directory, every regular file (or link to
// one) directly in it whose name ends in .yaml or .yml, sorted by name,
// skipping names that start with '.'. Why not descend into directories: a
// Kubernetes ConfigMap volume holds each file twice, as a link at the top
// and in a hidden timestamped directory. Why skip hidden names: editors
// leave hidden swap and backup files beside the ones they edit. A
// directory with no such file is refused: a wrong path must not start a
// server that limits nothing.
func Expand(paths []string) ([]string, error) {
	if len(paths) == 0 {
		return nil, errors.New("rules: no rules file or directory given")
	}
	var files []string
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("rules: %w", err)
		}
		if !fi.IsDir() {
			files = append(files, p)
			continue
		}
		ents, err := os.ReadDir(p)
		if err != nil {
			return nil, fmt.Errorf("rules: %w", err)
		}
		var in []string
		for _, e := range ents {
			name := e.Name()
			ext := filepath.Ext(name)
			if strings.HasPrefix(name, ".") || (ext != ".yaml" && ext != ".yml") {
				continue
			}
			f := filepath.Join(p, name)
			if fi, err := os.Stat(f); err != nil || !fi.Mode().IsRegular() {
				continue // a directory, a socket, a dangling link
			}
			in = append(in, f)
		}
		if len(in) == 0 {
			return nil, &Error{File: p, Msg: "no rules file (*.yaml, *.yml) in the directory"}
		}
		slices.Sort(in)
		files = append(files, in...)
	}
	return files, nil
}

// ErrNotRegular is the refusal of a rules path that names something other
// than a regular file or a directory: a named pipe, a socket, a device.
// Why refused: reading a pipe blocks until somebody writes to it (for good,
// if nobody does), and a device can be endless; a load must end.
var ErrNotRegular = errors.New("not a regular file: rules are read from regular files only")

// readCapped reads the regular file at path, refusing it past MaxFileSize
// without reading more than MaxFileSize+1 bytes, and refusing anything
// else (ErrNotRegular) without blocking: the file is opened without
// waiting for a writer (openNonBlocking) and checked once open, so a path
// swapped for a named pipe between Expand and here is refused too.
func readCapped(path string) ([]byte, error) {
	f, err := openNonBlocking(path)
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("rules: %s (%s): %w", path, kind(fi.Mode()), ErrNotRegular)
	}
	// Why read through a limit rather than trust Stat's size alone: the
	// file may grow between the two, or be a pipe or device with no size.
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	if len(data) > MaxFileSize {
		return nil, tooBig(path)
	}
	return data, nil
}

// kind names a file mode's type for an error message.
func kind(m os.FileMode) string {
	switch {
	case m&os.ModeNamedPipe != 0:
		return "a named pipe"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeDevice != 0:
		return "a device"
	case m.IsDir():
		return "a directory"
	}
	return "mode " + m.String()
}
