package keyhash

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"math/bits"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// refSum is the keyed hash written plainly over a byte slice, to check the
// specialised Hasher.String on every length path.
func refSum(hk Hasher, msg []byte) uint64 {
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

// TestHashKnownAnswers pins the hash: it is sharedbucket's hash id 2 (file
// format version 3), so a change to any output here changes where keys live
// in a file, and needs a new format version.
func TestHashKnownAnswers(t *testing.T) {
	hk := New(katK0, katK1)
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
		{49, 0x0f0fd7271c56346f}, {100, 0x1ea02509b22e1b42}, {maxLen - 1, 0x254ca43387934136}, {maxLen, 0x3cf3f0a74229862f},
	} {
		assert.Equal(t, fmt.Sprintf("%#016x", v.want), fmt.Sprintf("%#016x", hk.String(katMsg(v.n))), "len %d", v.n)
	}
	assert.Equal(t, fmt.Sprintf("%#016x", uint64(0xf167bf1702cdc954)), fmt.Sprintf("%#016x", hk.String("tenant-a:/api")))
}

// TestHashPaths checks String against the plain reference for every length
// from 0 to maxLen (every path: 1–3, 4–8, 9–16, and 16-byte chunks with
// every tail), under many file keys, and from unaligned starts.
func TestHashPaths(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, maxLen+8)
	for range 20 {
		hk := New(r.Uint64(), r.Uint64())
		for n := 0; n <= maxLen; n++ {
			for i := range buf {
				buf[i] = byte(r.Uint32())
			}
			off := r.IntN(8)
			msg := buf[off : off+n]
			require.Equal(t, refSum(hk, msg), hk.String(string(msg)), "len %d", n)
		}
	}
}

// TestHashLengths: keys that differ only in length, with the same words
// read (a short key repeats its bytes), hash apart.
func TestHashLengths(t *testing.T) {
	hk := New(3, 4)
	seen := map[uint64]string{}
	for _, c := range []string{"\x00", "a", "\xff"} {
		for n := 1; n <= maxLen; n++ {
			k := strings.Repeat(c, n)
			h := hk.String(k)
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
	for _, n := range []int{1, 3, 4, 7, 8, 9, 13, 15, 16, 17, 32, 33, 100, maxLen} {
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
		base := New(k0, k1)
		for bit := range 128 {
			f0, f1 := k0, k1
			if bit < 64 {
				f0 ^= 1 << bit
			} else {
				f1 ^= 1 << (bit - 64)
			}
			other := New(f0, f1)
			frac := flippedBits(msgs, func(m string) (uint64, uint64) { return base.String(m), other.String(m) })
			require.InDelta(t, 0.5, frac, 0.02, "key bit %d", bit)
		}
	}
}

// TestHashAvalanche: flipping any one input bit changes about half the
// output bits, on every length path.
func TestHashAvalanche(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	hk := New(r.Uint64(), r.Uint64())
	for _, n := range []int{1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 24, 32, 33, 64, maxLen} {
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
				return hk.String(m), hk.String(string(b))
			})
			require.InDelta(t, 0.5, frac, 0.08, "len %d bit %d", n, bit) // 7σ for 32 messages
		}
	}
}

// maxLen is the longest key the tests hash: sharedbucket's MaxKeyLen.
const maxLen = 256

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestWords: StringWords gives String's hash, and for every short length
// its words (with the length) tell apart every key of that length: each
// byte of the key is read into some word, so changing any one byte changes
// the pair. Longer keys get no words.
func TestWords(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	hk := New(r.Uint64(), r.Uint64())
	for n := 0; n <= ShortLen; n++ {
		for range 50 {
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(r.Uint32())
			}
			h, a0, b0 := hk.StringWords(string(b))
			require.Equal(t, hk.String(string(b)), h, "len %d", n)
			for i := range b {
				c := bytes.Clone(b)
				c[i] ^= 1 << r.IntN(8)
				_, a1, b1 := hk.StringWords(string(c))
				require.False(t, a0 == a1 && b0 == b1, "len %d: byte %d not read", n, i)
			}
		}
	}
	h, a, b := hk.StringWords(strings.Repeat("x", ShortLen+1))
	require.Equal(t, hk.String(strings.Repeat("x", ShortLen+1)), h)
	require.Zero(t, a|b)
}

// BenchmarkString is the hash of a 10-, 13- and 61-byte key, with
// hash/maphash (the runtime's AES hash here, seeded per process) as the
// baseline.
func BenchmarkString(b *testing.B) {
	hk := New(1, 2)
	seed := maphash.MakeSeed()
	for _, key := range []string{"tenant:hot", "tenant-a:/api", "tenant-0042:/api/v1/customers/orders/items?page=&sort=created"} {
		b.Run(fmt.Sprintf("impl=keyhash/len=%d", len(key)), func(b *testing.B) {
			var s uint64
			for b.Loop() {
				s += hk.String(key)
			}
			sink = s
		})
		b.Run(fmt.Sprintf("impl=maphash/len=%d", len(key)), func(b *testing.B) {
			var s uint64
			for b.Loop() {
				s += maphash.String(seed, key)
			}
			sink = s
		})
	}
}

var sink uint64
