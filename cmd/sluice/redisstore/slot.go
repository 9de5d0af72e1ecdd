package redisstore

import "strings"

// slots is the number of hash slots of a Redis Cluster.
const slots = 16384

// slot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of its hash
// tag, modulo 16384. The hash tag is what lies between the first '{' and
// the first '}' after it, if that is not empty; else the whole key.
//
// Why its own: a script call may only name keys of one slot (else Redis
// answers CROSSSLOT), so calls on a Cluster are grouped by slot before they
// are sent; go-redis computes slots too, but not in its public API.
func slot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^key[i]]
	}
	return crc % slots
}

// crcTable is CRC16/XMODEM's (polynomial 0x1021) per byte.
var crcTable = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()
