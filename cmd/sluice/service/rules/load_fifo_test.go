//go:build unix

package rules_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
)

// A rules path that is a named pipe (no writer, so opening it for reading
// would wait for good) is refused at once with ErrNotRegular, naming the
// path and what it is; so is /dev/zero, which would never end.
func TestLoadRefusesNamedPipe(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	done := make(chan error, 1)
	go func() {
		_, err := rules.LoadAll([]string{fifo}, rules.Options{})
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		// Unblock the open so the goroutine ends, then fail.
		w, _ := os.OpenFile(fifo, os.O_WRONLY, 0)
		_ = w.Close()
		<-done
		t.Fatal("LoadAll blocked on a named pipe")
	}
	require.ErrorIs(t, err, rules.ErrNotRegular)
	assert.ErrorContains(t, err, fifo+" (a named pipe): not a regular file")

	_, err = rules.LoadAll([]string{"/dev/zero"}, rules.Options{})
	require.ErrorIs(t, err, rules.ErrNotRegular)
	assert.ErrorContains(t, err, "/dev/zero (a device)")
}
