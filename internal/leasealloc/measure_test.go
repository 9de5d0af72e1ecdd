package leasealloc_test

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/leasealloc"
	"github.com/sluice-go/sluice/lease"
)

// TestMeasureLeaseMemory reports what a lease costs the server's heap when
// callers send names of the most bytes the allocator takes (holder and key
// of leasealloc.MaxNameLen): the worst case behind -lease-max-leases. Run
// with SLUICE_MEASURE=1 (docs/leases.md quotes it):
//
//	SLUICE_MEASURE=1 go test -run MeasureLeaseMemory -v -count=1 ./internal/leasealloc
func TestMeasureLeaseMemory(t *testing.T) {
	if os.Getenv("SLUICE_MEASURE") == "" {
		t.Skip("set SLUICE_MEASURE=1 to measure")
	}
	t0 := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	a, err := leasealloc.New(leasealloc.Config{Policies: map[string]leasealloc.Policy{"p": {Rate: 1e9, Burst: 1 << 30}}, NoLearning: true}, t0)
	require.NoError(t, err)
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	const requests, keys = 200, leasealloc.DefaultMaxKeys
	for r := range requests {
		req := &lease.Request{Holder: fmt.Sprintf("%06d", r) + strings.Repeat("h", leasealloc.MaxNameLen-6)}
		for i := range keys {
			req.Keys = append(req.Keys, lease.KeyRequest{Policy: "p", Want: 1,
				Key: fmt.Sprintf("%06d%06d", r, i) + strings.Repeat("k", leasealloc.MaxNameLen-12)})
		}
		_, err := a.RenewAt(t0, req)
		require.NoError(t, err)
	}
	runtime.GC()
	runtime.ReadMemStats(&m1)
	n := a.Stats().Leases
	require.Equal(t, requests*keys, n)
	per := float64(m1.HeapAlloc-m0.HeapAlloc) / float64(n)
	t.Logf("%d leases of %d-byte keys and holders: %.0f B a lease; %.1f GiB at %d leases",
		n, leasealloc.MaxNameLen, per, per*leasealloc.DefaultMaxLeases/(1<<30), leasealloc.DefaultMaxLeases)
}
