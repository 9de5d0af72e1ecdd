//go:build !unix

package bench_test

import "os/exec"

// ownGroup does nothing here: the servers started start no children.
func ownGroup(*exec.Cmd) {}

// killGroup kills cmd's process.
func killGroup(cmd *exec.Cmd) { _ = cmd.Process.Kill() }
