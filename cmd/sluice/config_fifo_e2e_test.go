//go:build unix

package main_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stopWithin sends SIGTERM and returns the exit code, failing the test
// (and killing the process) if it has not exited within d.
func (s *server) stopWithin(t *testing.T, d time.Duration) int {
	t.Helper()
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-s.done:
	case <-time.After(d):
		_ = s.cmd.Process.Kill()
		<-s.done
		_ = s.cmd.Wait()
		t.Fatalf("serve did not stop within %v of SIGTERM:\n%s", d, s.logs.String())
	}
	err := s.cmd.Wait()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	require.NoError(t, err)
	return 0
}

// A -config that is a named pipe is refused at start, at once and saying
// why; one swapped in for the rules file before a SIGHUP fails that reload
// at once (the rules in force stay), the next SIGHUP, from a regular file
// again, reloads, and SIGTERM stops the process.
func TestServeConfigNamedPipe(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary, "serve", "-addr", "127.0.0.1:0", "-store", "memory", "-config", fifo).CombinedOutput()
	require.NoError(t, ctx.Err(), "serve blocked at start on a named pipe: %s", out)
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "%s", out)
	assert.Equal(t, 2, ee.ExitCode())
	assert.Contains(t, string(out), fifo+" (a named pipe): not a regular file")

	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, path, "domain: http\ndescriptors:\n  - key: key\n    rate_limit: {unit: minute, requests_per_unit: 3}\n")
	s := serve(t, "-store", "memory", "-config", path)
	require.Equal(t, "3", get(t, s.URL+"/allow?key=a").header.Get("X-RateLimit-Limit"))

	require.NoError(t, os.Remove(path))
	require.NoError(t, syscall.Mkfifo(path, 0o600))
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Contains(s.logs.String(), "named pipe") },
		10*time.Second, 5*time.Millisecond, "%s", s.logs.String())
	assert.Contains(t, s.logs.String(), `msg="rules reload failed; keeping the rules in force"`)
	assert.Equal(t, "3", get(t, s.URL+"/allow?key=a").header.Get("X-RateLimit-Limit"))

	require.NoError(t, os.Remove(path))
	writeRules(t, path, "domain: http\ndescriptors:\n  - key: key\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Contains(s.logs.String(), `msg="rules reloaded"`) },
		10*time.Second, 5*time.Millisecond, "%s", s.logs.String())
	assert.Equal(t, "5", get(t, s.URL+"/allow?key=a").header.Get("X-RateLimit-Limit"))
	assert.Equal(t, 0, s.stopWithin(t, 15*time.Second))
}
