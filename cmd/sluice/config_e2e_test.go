package main_test

import (
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

// -config names a directory and a file together; SIGHUP rereads both: a
// file added to the directory and one removed take effect in one reload,
// and a domain in two files is refused (naming both) until
// -merge-domain-config.
func TestServeConfigDirectory(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, filepath.Join(dir, "api.yaml"), e2eRules)
	writeRules(t, filepath.Join(dir, "old.yml"), "domain: old\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2}\n")
	extra := filepath.Join(t.TempDir(), "extra.yaml")
	writeRules(t, extra, "domain: extra\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4}\n")
	s := serve(t, "-store", "memory", "-grpc", "127.0.0.1:0", "-config", dir, "-config", extra)
	assert.Contains(t, s.logs.String(), `domains=api,old,extra rules=3`)
	c := rlsClient(t, s)
	assert.EqualValues(t, 1, shouldRateLimit(t, c, "old", "k", "v").Statuses[0].LimitRemaining)
	assert.EqualValues(t, 3, shouldRateLimit(t, c, "extra", "k", "v").Statuses[0].LimitRemaining)

	require.NoError(t, os.Remove(filepath.Join(dir, "old.yml")))
	writeRules(t, filepath.Join(dir, "new.yaml"), "domain: new\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 6}\n")
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGHUP))
	// A real process: wait for the line that says the reload happened.
	require.Eventually(t, func() bool { return strings.Contains(s.logs.String(), `msg="rules reloaded"`) },
		10*time.Second, 5*time.Millisecond, "%s", s.logs.String())
	assert.Nil(t, shouldRateLimit(t, c, "old", "k", "v").Statuses[0].CurrentLimit, "removed file: no limit")
	assert.EqualValues(t, 5, shouldRateLimit(t, c, "new", "k", "v").Statuses[0].LimitRemaining)
	assert.EqualValues(t, 2, shouldRateLimit(t, c, "extra", "k", "v").Statuses[0].LimitRemaining, "extra's bucket kept")
	assert.Equal(t, 0, s.stop(t))

	writeRules(t, filepath.Join(dir, "api-more.yaml"), "domain: api\ndescriptors:\n  - key: team\n    rate_limit: {unit: second, requests_per_unit: 7}\n")
	out, err := exec.Command(binary, "serve", "-addr", "127.0.0.1:0", "-config", dir).CombinedOutput()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "%s", out)
	assert.Equal(t, 2, ee.ExitCode())
	assert.Contains(t, string(out), filepath.Join(dir, "api.yaml")+`:2: domain: "api" is configured twice (first in `+filepath.Join(dir, "api-more.yaml"))
	s = serve(t, "-store", "memory", "-grpc", "127.0.0.1:0", "-config", dir, "-merge-domain-config")
	assert.Contains(t, s.logs.String(), `domains=api,new rules=3`)
	assert.Equal(t, 0, s.stop(t))
}
