package redistest

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A replica saves the master's snapshot to its working directory when it
// syncs. That directory must be the server's own, never the directory the
// test runs in, or a test run leaves dump.rdb in the package's source tree.
func TestReplicaSyncWritesNothingHere(t *testing.T) {
	_, err := os.Stat("dump.rdb")
	require.True(t, os.IsNotExist(err), "dump.rdb is in the package directory before the test")

	master := Start(t)
	_, err = master.Do("SET", "k", "v")
	require.NoError(t, err)
	replica := StartWith(t, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))

	// A real process syncing: poll its INFO until the link is up.
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := replica.Do("INFO", "replication")
		require.NoError(t, err)
		if strings.Contains(info, "master_link_status:up") {
			break
		}
		require.False(t, time.Now().After(deadline), "replica never synced: %s", info)
		time.Sleep(10 * time.Millisecond)
	}
	got, err := replica.Do("GET", "k")
	require.NoError(t, err)
	require.Equal(t, "v", got)

	_, err = os.Stat("dump.rdb")
	if err == nil {
		_ = os.Remove("dump.rdb")
	}
	assert.True(t, os.IsNotExist(err), "the replica wrote dump.rdb into the test's working directory")
}
