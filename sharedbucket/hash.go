package sharedbucket

import (
	"encoding/binary"
	"math/bits"
	"unsafe"
)

// hasher is a table's keyed hash of keys (hash id 2 in the file header): a
// multiply-fold over 16-byte chunks in the style of wyhash and rapidhash,
// keyed by secret words derived from the file's random 128-bit hash key.
// The secret words are derived once, when a process opens the table, and
// live only in its memory; the file holds the 128-bit key alone.
//
// Why a keyed hash, and why this one:
//
//   - It must be the same in every process that maps the file, since it
//     decides slot positions and the key words stored in the slots. So not
//     hash/maphash nor the runtime's map hash, whose seeds are per process.
//   - It must be keyed with a secret per file, so that nobody who cannot
//     read the file can choose keys that collide in one probe window and
//     evict live buckets at will.
//   - It is on every call's path. SipHash-1-3 (format version 2) cost
//     17.5 ns for a 13-byte key, a quarter of a hot-key check; this hash
//     costs two 64×64→128-bit multiplies for keys up to 16 bytes, 6.0 ns in
//     the same run (BenchmarkHash).
//
// Why both operands of every multiply are keyed: mix(x, y) is 0 whenever
// x or y is 0, whatever else went in. Plain wyhash multiplies input words by
// public constants on one side, so an input word equal to such a constant
// gives the same hash under every seed: a collision anyone can compute.
// Here every operand is an input word (or the length) XORed with a secret
// word, or a value already derived from secret words, so no input known in
// advance zeroes or fixes a product. Go's runtime does the same in the map
// hash it falls back to where AES instructions are missing
// (memhashFallback in runtime/hash64.go, its defence against hash
// flooding): both sides of each multiply of input words are XORed with
// per-process random words. Only its last multiply, by the length, has a
// public side (a constant); here that one is keyed too.
type hasher struct {
	s [5]uint64 // secret words, see newHasher
}

// newHasher derives the secret words from the file's hash key (k0, k1):
// a SplitMix64 sequence from k0, each output passed through SplitMix64's
// finaliser again with k1 mixed in, so every word depends on all 128 bits.
func newHasher(k0, k1 uint64) hasher {
	var hk hasher
	x := k0
	for i := range hk.s {
		x += 0x9e3779b97f4a7c15 // SplitMix64's increment (2^64 / φ, odd)
		hk.s[i] = splitMixFinal(splitMixFinal(x) ^ k1)
	}
	return hk
}

// splitMixFinal is SplitMix64's output function (a bijection of uint64).
func splitMixFinal(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// mix is the multiply-fold: the 128-bit product of a and b, halves XORed.
func mix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// hash is the key word of key: sum cut to 63 bits (the top bit is the slot
// protocol's lock bit), with 0 (the empty-slot marker) mapped to 1.
func (hk *hasher) hash(key string) uint64 {
	h := hk.sum(key) &^ lockBit
	if h == 0 {
		h = 1
	}
	return h
}

// sum is the 64-bit keyed hash of key, for any length (callers pass at most
// MaxKeyLen bytes). Up to 16 bytes it reads the key as two words (which
// overlap, or repeat bytes, for short keys: for a given length the pair
// still determines the key) and multiplies twice: the words with secrets,
// then the result with the length and another secret, so keys of different
// lengths whose words agree do not collide. Longer keys are folded 16 bytes
// at a time into seed first, as Go's memhashFallback does.
func (hk *hasher) sum(key string) uint64 {
	n := uint64(len(key))
	p := unsafe.Pointer(unsafe.StringData(key))
	seed := hk.s[0]
	var a, b uint64
	switch {
	case n == 0:
	case n < 4:
		a = uint64(*(*byte)(p))<<16 | uint64(*(*byte)(unsafe.Add(p, n>>1)))<<8 | uint64(*(*byte)(unsafe.Add(p, n-1)))
	case n <= 8:
		a = uint64(load32(p, 0))
		b = uint64(load32(p, n-4))
	case n <= 16:
		a = load64(p, 0)
		b = load64(p, n-8)
	default:
		// Whole 16-byte chunks while more than 16 bytes are left, then the
		// last 16 bytes (overlapping the last chunk unless n is a multiple
		// of 16).
		for i := uint64(0); n-i > 16; i += 16 {
			seed = mix(load64(p, i)^hk.s[1], load64(p, i+8)^seed)
		}
		a = load64(p, n-16)
		b = load64(p, n-8)
	}
	return mix(n^hk.s[3], mix(a^hk.s[1], b^hk.s[2]^seed)^hk.s[4])
}

// load64 and load32 read little-endian words at p+off (one load on amd64
// and arm64; the same value on any byte order, so the hash is too).
func load64(p unsafe.Pointer, off uint64) uint64 {
	return binary.LittleEndian.Uint64((*[8]byte)(unsafe.Add(p, off))[:])
}

func load32(p unsafe.Pointer, off uint64) uint32 {
	return binary.LittleEndian.Uint32((*[4]byte)(unsafe.Add(p, off))[:])
}
