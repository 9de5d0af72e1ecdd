package service_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/sharedbucket"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/shmstore"
)

// TestSlotHealthVisible: an shm table whose slots hold a lock left by a
// process long gone and words no process could have written. /stats shows
// the slots locked and the lock taken over; the next new key's claim resets
// the impossible words, and /metrics shows that.
func TestSlotHealthVisible(t *testing.T) {
	dir, err := os.MkdirTemp("", "sluice-slots-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	st, err := shmstore.Open(dir, sharedbucket.WithSlots(8))
	require.NoError(t, err)
	t.Cleanup(func() { st.Close() })
	srv, err := service.New(service.Config{Store: st, Default: store.Policy{Rate: 1.0 / 3600, Burst: 1},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	get := func(path string) []byte {
		resp, err := ts.Client().Get(ts.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return b
	}
	get("/allow?key=a") // opens the default policy's table

	// Damage the file's 8 slots (16 bytes each, after the 4096-byte
	// header page): 7 of 0xff bytes (a lock dated far in the future: no
	// process wrote it), and one lock taken 2 ms after boot by pid 1 (top
	// bit; time in 2^21 ns units from bit 22; pid in bits 0..21): stale.
	files, err := filepath.Glob(filepath.Join(dir, "*"+sharedbucket.TableExt))
	require.NoError(t, err)
	require.Len(t, files, 1)
	slots := bytes.Repeat([]byte{0xff}, 8*16)
	binary.LittleEndian.PutUint64(slots[7*16:], 1<<63|1<<22|1)
	binary.LittleEndian.PutUint64(slots[7*16+8:], 0)
	f, err := os.OpenFile(files[0], os.O_RDWR, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(slots, 4096)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	var stats struct {
		Policies map[string]service.PolicyEvictions `json:"policies"`
	}
	require.NoError(t, json.Unmarshal(get("/stats"), &stats))
	assert.Equal(t, service.PolicySlots{Locked: 7, Recovered: 1}, stats.Policies["default"].PolicySlots)

	get("/allow?key=b") // a new key's claim looks at every slot of its window
	body := string(get("/metrics"))
	assert.Contains(t, body, `sluice_locked_slots{policy="default"} 0`)
	assert.Contains(t, body, `sluice_recovered_locks_total{policy="default"} 1`)
	assert.Contains(t, body, `sluice_corrupt_words_total{policy="default"} 7`)
}
