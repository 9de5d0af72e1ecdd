//go:build linux || darwin

package sharedbucket

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// refSum is the keyed hash written plainly over a byte slice, to check the
// specialised hasher.sum on every length path.
func refSum(hk hasher, msg []byte) uint64 {
	le := binary.LittleEndian
	n := len(msg)
	seed := hk.s[0]
	var a, b uint64
	switch {
	case n == 0:
	case n <= 3:
		a = uint64(msg[0])<<16 | uint64(msg[n/2])<<8 | uint64(msg[n-1])
	case n <= 8:
		a, b = uint64(le.Uint32(msg)), uint64(le.Uint32(msg[n-4:]))
	case n <= 16:
		a, b = le.Uint64(msg), le.Uint64(msg[n-8:])
	default:
		rest := msg
		for len(rest) > 16 {
			hi, lo := bits.Mul64(le.Uint64(rest)^hk.s[1], le.Uint64(rest[8:])^seed)
			seed = hi ^ lo
			rest = rest[16:]
		}
		a, b = le.Uint64(msg[n-16:]), le.Uint64(msg[n-8:])
	}
	hi, lo := bits.Mul64(a^hk.s[1], b^hk.s[2]^seed)
	hi, lo = bits.Mul64(uint64(n)^hk.s[3], hi^lo^hk.s[4])
	return hi ^ lo
}

// katKey is the fixed file key of the known-answer vectors.
const katK0, katK1 = 0x0706050403020100, 0x0f0e0d0c0b0a0908

// katMsg is the message of length n of the known-answer vectors: bytes
// 0, 1, 2, … (mod 251, so long messages are not periodic in 16 bytes).
func katMsg(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i % 251)
	}
	return string(b)
}

// TestHashKnownAnswers pins the hash (format version 3, hash id 2): a
// change to any output here changes where keys live in a file, and needs a
// new format version.
func TestHashKnownAnswers(t *testing.T) {
	hk := newHasher(katK0, katK1)
	assert.Equal(t, [5]uint64{
		0x45ecfe5342317e2a, 0x34d5eba21d01c3c7, 0x5eafb33642345610, 0x62d80075c40d48da, 0xf783e5904a7970b2,
	}, hk.s, "secret words")
	for _, v := range []struct {
		n    int
		want uint64
	}{
		{1, 0x9f9f6cab411eabbb}, {2, 0xc8570ad98a3e4109}, {3, 0x4dd8cbaf83ab22ca}, {4, 0x94282d46f5078369},
		{5, 0x7d6806a83c75274f}, {7, 0x87bc23248772c739}, {8, 0x1afe7c4a91587c1e}, {9, 0xd9e061e9eaa5a25e},
		{13, 0xc6d61959f25a512f}, {15, 0xbd4e4c07d56a5ff5}, {16, 0x68f9da33164f7cac}, {17, 0x9fd7f7e4b393b00d},
		{31, 0x4b6a554e8ceb73d5}, {32, 0x3f0700a8d9c03a4a}, {33, 0x959d88781b35c5ec}, {48, 0x18cce671226d4abb},
		{49, 0x0f0fd7271c56346f}, {100, 0x1ea02509b22e1b42}, {MaxKeyLen - 1, 0x254ca43387934136}, {MaxKeyLen, 0x3cf3f0a74229862f},
	} {
		assert.Equal(t, fmt.Sprintf("%#016x", v.want), fmt.Sprintf("%#016x", hk.sum(katMsg(v.n))), "len %d", v.n)
	}
	assert.Equal(t, fmt.Sprintf("%#016x", uint64(0xf167bf1702cdc954)), fmt.Sprintf("%#016x", hk.sum("tenant-a:/api")))
	assert.Equal(t, uint64(0x7167bf1702cdc954), hk.hash("tenant-a:/api"), "the top bit cut")
}

// TestHashPaths checks sum against the plain reference for every length
// from 0 to MaxKeyLen (every path: 1–3, 4–8, 9–16, and 16-byte chunks with
// every tail), under many file keys, and from unaligned starts.
func TestHashPaths(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, MaxKeyLen+8)
	for range 20 {
		hk := newHasher(r.Uint64(), r.Uint64())
		for n := 0; n <= MaxKeyLen; n++ {
			for i := range buf {
				buf[i] = byte(r.Uint32())
			}
			off := r.IntN(8)
			msg := buf[off : off+n]
			require.Equal(t, refSum(hk, msg), hk.sum(string(msg)), "len %d", n)
		}
	}
	hk := newHasher(1, 2)
	assert.NotZero(t, hk.hash(""))
	assert.Zero(t, hk.hash("tenant-a:/api")&lockBit)
}

// TestHashLengths: keys that differ only in length, with the same words
// read (a short key repeats its bytes), hash apart.
func TestHashLengths(t *testing.T) {
	hk := newHasher(3, 4)
	seen := map[uint64]string{}
	for _, c := range []string{"\x00", "a", "\xff"} {
		for n := 1; n <= MaxKeyLen; n++ {
			k := strings.Repeat(c, n)
			h := hk.sum(k)
			require.NotContains(t, seen, h, "%q and %q collide", seen[h], k)
			seen[h] = k
		}
	}
}

// flipped returns the mean fraction of output bits that change, over
// msgs, when f changes its input.
func flippedBits(msgs []string, f func(msg string) (uint64, uint64)) float64 {
	total := 0
	for _, m := range msgs {
		a, b := f(m)
		total += bits.OnesCount64(a ^ b)
	}
	return float64(total) / float64(64*len(msgs))
}

func hashInputs(r *rand.Rand) []string {
	var msgs []string
	for _, n := range []int{1, 3, 4, 7, 8, 9, 13, 15, 16, 17, 32, 33, 100, MaxKeyLen} {
		for range 50 {
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(r.Uint32())
			}
			msgs = append(msgs, string(b))
		}
	}
	for i := range 200 {
		msgs = append(msgs, fmt.Sprintf("client-%08x", i), fmt.Sprintf("tenant-%d:/api/v1/items", i))
	}
	return msgs
}

// TestHashKeyed: every bit of the 128-bit file key matters. Flipping any
// one of them changes about half the output bits, on every kind of input
// (a hash whose output ignored part of the key, or depended on it weakly,
// would let whoever guesses the rest predict positions).
func TestHashKeyed(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	msgs := hashInputs(r)
	for range 4 {
		k0, k1 := r.Uint64(), r.Uint64()
		base := newHasher(k0, k1)
		for bit := range 128 {
			f0, f1 := k0, k1
			if bit < 64 {
				f0 ^= 1 << bit
			} else {
				f1 ^= 1 << (bit - 64)
			}
			other := newHasher(f0, f1)
			frac := flippedBits(msgs, func(m string) (uint64, uint64) { return base.sum(m), other.sum(m) })
			require.InDelta(t, 0.5, frac, 0.02, "key bit %d", bit)
		}
	}
}

// TestHashAvalanche: flipping any one input bit changes about half the
// output bits, on every length path.
func TestHashAvalanche(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	hk := newHasher(r.Uint64(), r.Uint64())
	for _, n := range []int{1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 24, 32, 33, 64, MaxKeyLen} {
		var msgs []string
		for range 32 {
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(r.Uint32())
			}
			msgs = append(msgs, string(b))
		}
		for bit := range 8 * n {
			frac := flippedBits(msgs, func(m string) (uint64, uint64) {
				b := []byte(m)
				b[bit/8] ^= 1 << (bit % 8)
				return hk.sum(m), hk.sum(string(b))
			})
			require.InDelta(t, 0.5, frac, 0.08, "len %d bit %d", n, bit) // 7σ for 32 messages
		}
	}
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
