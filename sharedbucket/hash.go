package sharedbucket

import (
	"encoding/binary"
	"math/bits"
	"unsafe"
)

// hashKey is SipHash-1-3 of key under the table's 128-bit random key (k0,
// k1), cut to 63 bits, with 0 (the empty-slot marker) mapped to 1.
//
// Why SipHash and not FNV or hash/maphash: the hash must be the same in
// every process (maphash seeds are per process), and it must be keyed with a
// secret per file so that nobody can choose keys that collide in one probe
// window to evict live buckets at will. SipHash-1-3 is the keyed PRF Rust's
// standard library uses for the same reason; it is frozen by the format
// version.
func hashKey(k0, k1 uint64, key string) uint64 {
	h := sip13(k0, k1, key) &^ lockBit // the top bit belongs to the slot protocol
	if h == 0 {
		h = 1
	}
	return h
}

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
