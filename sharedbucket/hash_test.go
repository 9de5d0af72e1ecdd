//go:build linux || darwin

package sharedbucket

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
)

// sipGeneric is SipHash-c-d written plainly from the paper, to check the
// specialised SipHash-1-3.
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
	k0 := binary.LittleEndian.Uint64([]byte{0, 1, 2, 3, 4, 5, 6, 7})
	k1 := binary.LittleEndian.Uint64([]byte{8, 9, 10, 11, 12, 13, 14, 15})
	msg := []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}
	assert.Equal(t, uint64(0xa129ca6149be45e5), sipGeneric(2, 4, k0, k1, msg))

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
	assert.NotEqual(t, hashKey(1, 2, "a"), hashKey(1, 3, "a"), "keyed")
	assert.NotZero(t, hashKey(0, 0, ""))
}
