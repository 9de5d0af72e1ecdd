//go:build linux || darwin

package sharedbucket

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
)

// TestHashKeyWord: a table's key word is the keyed hash (internal/keyhash,
// whose tests pin it) with the lock bit cut, and never the empty marker.
// katK0, katK1 is the key 00..0f: keyhash's known-answer key, and the
// SipHash paper's.
const katK0, katK1 = 0x0706050403020100, 0x0f0e0d0c0b0a0908

func TestHashKeyWord(t *testing.T) {
	hk := newHasher(katK0, katK1)
	assert.Equal(t, uint64(0xf167bf1702cdc954), hk.String("tenant-a:/api"))
	assert.Equal(t, uint64(0x7167bf1702cdc954), hk.hash("tenant-a:/api"), "the top bit cut")
	assert.NotZero(t, hk.hash(""))
}

// maxWindow returns the largest number of keys whose home slot lies in
// one probe window (probeWindow consecutive slots, wrapping) of a table
// of slots slots, under hash h, and the number of keys per floor word.
func maxWindow(keys []string, slots uint64, h func(string) uint64) int {
	homes := make([]int, slots)
	for _, k := range keys {
		homes[h(k)&(slots-1)]++
	}
	most := 0
	for i := range slots {
		n := 0
		for j := range uint64(probeWindow) {
			n += homes[(i+j)&(slots-1)]
		}
		most = max(most, n)
	}
	return most
}

// TestHashDistribution: structured keys (what a service sees: client ids,
// tenant paths) land in a small table's probe windows as evenly as
// SipHash-1-3 (the previous hash) and as uniformly random homes put them.
// Averaged over many file keys, the fullest window may hold at most one
// key more than either; and the floor words (picked by the top bits) get
// keys as evenly as random picks (a chi-square bound).
func TestHashDistribution(t *testing.T) {
	const slots = 1024
	sets := map[string][]string{}
	for i := range slots {
		sets["client-%08x"] = append(sets["client-%08x"], fmt.Sprintf("client-%08x", i))
		sets["tenant-N:/path"] = append(sets["tenant-N:/path"], fmt.Sprintf("tenant-%d:/api/v%d/items", i/8, i%8))
		sets["ip"] = append(sets["ip"], fmt.Sprintf("10.0.%d.%d", i/256, i%256))
	}
	r := rand.New(rand.NewPCG(9, 10))
	const trials = 200
	for name, keys := range sets {
		var ours, sip, random float64
		var chi float64
		for range trials {
			k0, k1 := r.Uint64(), r.Uint64()
			hk := newHasher(k0, k1)
			ours += float64(maxWindow(keys, slots, hk.hash))
			sip += float64(maxWindow(keys, slots, func(k string) uint64 { return sip13(k0, k1, k) &^ lockBit }))
			random += float64(maxWindow(keys, slots, func(string) uint64 { return r.Uint64() }))
			var floors [floorCount]float64
			for _, k := range keys {
				floors[hk.hash(k)>>55%floorCount]++
			}
			exp := float64(len(keys)) / floorCount
			for _, f := range floors {
				chi += (f - exp) * (f - exp) / exp
			}
		}
		ours, sip, random, chi = ours/trials, sip/trials, random/trials, chi/trials
		t.Logf("%s: fullest window %.2f keys (SipHash-1-3 %.2f, random %.2f; mean %d); floor chi-square %.1f (df %d)",
			name, ours, sip, random, probeWindow, chi, floorCount-1)
		assert.LessOrEqual(t, ours, sip+1, name)
		assert.LessOrEqual(t, ours, random+1, name)
		// Mean chi-square over 200 trials of 255 degrees of freedom: 255 ±
		// 1.6 for uniform picks.
		assert.InDelta(t, floorCount-1, chi, 10, name)
	}
}

// sipGeneric is SipHash-c-d written plainly from the paper, to check
// sip13, the previous format's hash, kept as the distribution test's
// yardstick.
func sipGeneric(c, d int, k0, k1 uint64, msg []byte) uint64 {
	v0 := k0 ^ 0x736f6d6570736575
	v1 := k1 ^ 0x646f72616e646f6d
	v2 := k0 ^ 0x6c7967656e657261
	v3 := k1 ^ 0x7465646279746573
	round := func() {
		v0 += v1
		v1 = bits.RotateLeft64(v1, 13) ^ v0
		v0 = bits.RotateLeft64(v0, 32)
		v2 += v3
		v3 = bits.RotateLeft64(v3, 16) ^ v2
		v0 += v3
		v3 = bits.RotateLeft64(v3, 21) ^ v0
		v2 += v1
		v1 = bits.RotateLeft64(v1, 17) ^ v2
		v2 = bits.RotateLeft64(v2, 32)
	}
	padded := make([]byte, (len(msg)/8+1)*8)
	copy(padded, msg)
	padded[len(padded)-1] = byte(len(msg))
	for i := 0; i < len(padded); i += 8 {
		m := binary.LittleEndian.Uint64(padded[i:])
		v3 ^= m
		for range c {
			round()
		}
		v0 ^= m
	}
	v2 ^= 0xff
	for range d {
		round()
	}
	return v0 ^ v1 ^ v2 ^ v3
}

func TestSipHash(t *testing.T) {
	// The reference vector of the SipHash paper (SipHash-2-4, key 00..0f,
	// message 00..0e) pins the round function and padding.
	msg := []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}
	assert.Equal(t, uint64(0xa129ca6149be45e5), sipGeneric(2, 4, katK0, katK1, msg))

	r := rand.New(rand.NewPCG(1, 2))
	for n := range 40 {
		for range 20 {
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(r.Uint32())
			}
			k0, k1 := r.Uint64(), r.Uint64()
			assert.Equal(t, sipGeneric(1, 3, k0, k1, b), sip13(k0, k1, string(b)), "len %d", n)
		}
	}
}

// sip13 is SipHash-1-3, the hash of format version 2, now the yardstick of
// TestHashDistribution and BenchmarkHash.
func sip13(k0, k1 uint64, key string) uint64 {
	v0 := k0 ^ 0x736f6d6570736575
	v1 := k1 ^ 0x646f72616e646f6d
	v2 := k0 ^ 0x6c7967656e657261
	v3 := k1 ^ 0x7465646279746573
	n := len(key)
	p := unsafe.Slice(unsafe.StringData(key), n)
	for len(p) >= 8 {
		m := binary.LittleEndian.Uint64(p)
		v3 ^= m
		v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
		v0 ^= m
		p = p[8:]
	}
	b := uint64(n) << 56
	switch len(p) {
	case 7:
		b |= uint64(p[6]) << 48
		fallthrough
	case 6:
		b |= uint64(p[5]) << 40
		fallthrough
	case 5:
		b |= uint64(p[4]) << 32
		fallthrough
	case 4:
		b |= uint64(binary.LittleEndian.Uint32(p))
	case 3:
		b |= uint64(p[2]) << 16
		fallthrough
	case 2:
		b |= uint64(p[1]) << 8
		fallthrough
	case 1:
		b |= uint64(p[0])
	}
	v3 ^= b
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0 ^= b
	v2 ^= 0xff
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	return v0 ^ v1 ^ v2 ^ v3
}

func sipRound(v0, v1, v2, v3 uint64) (uint64, uint64, uint64, uint64) {
	v0 += v1
	v1 = bits.RotateLeft64(v1, 13)
	v1 ^= v0
	v0 = bits.RotateLeft64(v0, 32)
	v2 += v3
	v3 = bits.RotateLeft64(v3, 16)
	v3 ^= v2
	v0 += v3
	v3 = bits.RotateLeft64(v3, 21)
	v3 ^= v0
	v2 += v1
	v1 = bits.RotateLeft64(v1, 17)
	v1 ^= v2
	v2 = bits.RotateLeft64(v2, 32)
	return v0, v1, v2, v3
}
