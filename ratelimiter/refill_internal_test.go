package ratelimiter

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestReachedAgreesWithAccrued: Fill's division-free "is the bucket full
// again" test says exactly what accrued's whole count says, at rates and
// spans from the smallest to the largest, and at the boundaries (the
// instant a token is due, and one nanosecond before).
func TestReachedAgreesWithAccrued(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 1))
	rates := []float64{minRate, 1e-3, 0.5, 1, 7.3, 100, 1e6, 1e9 - 1, maxRate}
	for range 2000 {
		rates = append(rates, minRate+r.Float64()*r.Float64()*(maxRate-minRate))
	}
	for _, rate := range rates {
		b := &bucket{nanoRate: uint64(rate*1e9 + 0.5)}
		for range 20 {
			k := r.Int64N(1 << uint(r.IntN(40)))
			d := b.due(k)
			for _, dd := range []time.Duration{d - 1, d, d + 1, time.Duration(r.Int64N(int64(neverDelay)))} {
				whole, _ := b.accrued(dd)
				require.Equal(t, whole >= k, b.reached(dd, k), "rate %v k %d d %v", rate, k, dd)
			}
		}
	}
}
