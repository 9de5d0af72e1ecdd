// Package keyhash is the keyed hash of rate-limit keys that sharedbucket
// stores in its files (hash id 2 of file format version 3) and that the
// memory store uses within one process: a multiply-fold over 16-byte chunks
// in the style of wyhash and rapidhash, keyed by secret words derived from a
// random 128-bit key.
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
//
// A key of at most ShortLen bytes is read as two words (StringWords); with
// its length they determine the key, so a table can store and compare the
// words instead of the key's bytes, which sit elsewhere in memory.
package keyhash

import (
	"encoding/binary"
	"math/bits"
	"unsafe"
)

// ShortLen is the longest key whose words StringWords returns.
const ShortLen = 16

// Hasher is a keyed hash of strings. The zero value is a valid but unkeyed
// hash, of no use against chosen keys; use New. Safe for concurrent use
// (it is never written after New).
type Hasher struct {
	s [5]uint64 // secret words, see New
}

// New derives a Hasher's secret words from the 128-bit key (k0, k1): a
// SplitMix64 sequence from k0, each output passed through SplitMix64's
// finaliser again with k1 mixed in, so every word depends on all 128 bits.
func New(k0, k1 uint64) Hasher {
	var hk Hasher
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

// String is the 64-bit keyed hash of key, for any length.
func (hk *Hasher) String(key string) uint64 {
	h, _, _ := hk.StringWords(key)
	return h
}

// StringWords is String, and for a key of at most ShortLen bytes the two
// words it read the key as: with the key's length they determine the key,
// so a table may store and compare them instead of the key's bytes. Up to
// 16 bytes are read as two words that overlap, or repeat bytes, for short
// keys (1–3 bytes: the first, middle and last byte). For longer keys a and
// b are 0.
//
// A short key's words are multiplied twice: with secrets, then the result
// with the length and another secret, so keys of different lengths whose
// words agree do not collide. Longer keys are first folded 16 bytes at a
// time into a seed, as Go's memhashFallback does, and end with their last
// 16 bytes.
func (hk *Hasher) StringWords(key string) (h, a, b uint64) {
	n := uint64(len(key))
	p := unsafe.Pointer(unsafe.StringData(key))
	seed := hk.s[0] // loaded first: it is on the multiplies' critical path
	switch {
	case n == 0:
	case n < 4:
		a = uint64(*(*byte)(p))<<16 | uint64(*(*byte)(unsafe.Add(p, n>>1)))<<8 | uint64(*(*byte)(unsafe.Add(p, n-1)))
	case n <= 8:
		a = uint64(load32(p, 0))
		b = uint64(load32(p, n-4))
	case n <= ShortLen:
		a = load64(p, 0)
		b = load64(p, n-8)
	default:
		// Whole 16-byte chunks while more than 16 bytes are left, then the
		// last 16 bytes (overlapping the last chunk unless n is a multiple
		// of 16), which are not a short key's words: a and b stay 0.
		for i := uint64(0); n-i > 16; i += 16 {
			seed = mix(load64(p, i)^hk.s[1], load64(p, i+8)^seed)
		}
		return hk.fold(n, load64(p, n-16), load64(p, n-8), seed), 0, 0
	}
	return hk.fold(n, a, b, seed), a, b
}

// fold is the last two multiplies: the words with secrets (and seed, which
// carries a long key's earlier chunks), then the result with the length.
func (hk *Hasher) fold(n, a, b, seed uint64) uint64 {
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
