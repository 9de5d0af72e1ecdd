package sharedbucket

import "github.com/sluice-go/sluice/internal/keyhash"

// hasher is a table's keyed hash of keys (hash id 2 in the file header):
// keyhash's multiply-fold, keyed by secret words derived from the file's
// random 128-bit hash key. The secret words are derived once, when a
// process opens the table, and live only in its memory; the file holds the
// 128-bit key alone.
//
// Why a keyed hash, and why this one:
//
//   - It must be the same in every process that maps the file, since it
//     decides slot positions and the key words stored in the slots. So not
//     hash/maphash nor the runtime's map hash, whose seeds are per process.
//   - It must be keyed with a secret per file, so that nobody who cannot
//     read the file can choose keys that collide in one probe window and
//     evict live buckets at will.
//   - It is on every call's path. SipHash-1-3 (format version 2) costs
//     about three times this hash (BenchmarkHash compares them), which costs two
//     64×64→128-bit multiplies for keys up to 16 bytes.
type hasher struct {
	keyhash.Hasher
}

func newHasher(k0, k1 uint64) hasher { return hasher{keyhash.New(k0, k1)} }

// hash is the key word of key: its keyhash cut to 63 bits (the top bit is
// the slot protocol's lock bit), with 0 (the empty-slot marker) mapped to 1.
//
// Why StringWords rather than String: it keeps hash small enough to
// inline, so a check pays one call for its hash, not two.
func (hk *hasher) hash(key string) uint64 {
	h, _, _ := hk.StringWords(key)
	if h &^= lockBit; h == 0 {
		h = 1
	}
	return h
}
