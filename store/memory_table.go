package store

import (
	"math"
	"sync"
	"sync/atomic"

	"github.com/sluice-go/sluice/internal/keyhash"
)

// Memory's table: 256 shards, each a linear-probing hash table that
// lock-free readers probe and that writers replace whole under the
// shard's lock (see Memory for what the store does with it).

// A memShard is the keys whose hash ends in its index. Lookups read tab
// without the lock; the lock serialises the writers: inserting a key, and
// replacing tab (to grow it, or to drop full keys in a sweep).
type memShard struct {
	mu   sync.Mutex
	n    int                      // guarded by mu: keys in tab
	long bool                     // guarded by mu: the shard has held a long key, so its tables keep memTable.long
	tab  atomic.Pointer[memTable] // stored only under mu; nil while the shard holds no key
	_    [32]byte                 // keep neighbouring shards off one cache line
}

// A memTable is a linear-probing hash table of at least twice as many slots as
// keys, so a probe always meets an empty slot. A slot, once filled, keeps its
// key for the table's life (nothing is deleted in place: a sweep builds a new
// table), which is what lets readers probe without the lock.
type memTable struct {
	slots []memSlot
	long  []string // parallel to slots: the keys longer than keyhash.ShortLen; nil if the shard had none when t was made
	mask  uint64   // len(slots)-1, a power of two minus one
}

type memSlot struct {
	// tag is 0 for an empty slot, else memKey.tag. It is stored after w
	// (and the slot's memTable.long entry), so a reader that loads a
	// non-zero tag sees them written.
	tag atomic.Uint64
	// tat is the key's theoretical arrival time, or frozen once the table is
	// being replaced: the value then lives in the new table.
	tat atomic.Int64
	w   [2]uint64 // memKey.w0 and w1; written before tag, never after
}

// A memKey is a key as a memTable compares it, with the key itself passed
// beside it when it is long. Why words: a key of up to keyhash.ShortLen
// bytes (an IP address, a user id) is determined by its length and the two
// words its hash read it as, so a slot holds those and a lookup never reads
// the stored key's bytes, a cache miss of their own when the key is not
// hot. Longer keys are compared whole.
//
// Why the long key is not a field, and the words not a [2]uint64: the
// compiler keeps a struct in registers only if it has at most four scalar
// fields and 32 bytes. Held in memory, the key was built on the stack and
// copied again on its way to find, a store-forwarding stall that cost about
// a tenth of a hot-key decision.
type memKey struct {
	// tag is the key's hash with its length class (the length, or
	// keyhash.ShortLen+1 for any longer key) in bits 58–62 and the top bit
	// set, so no tag is 0 and keys of different lengths never match.
	tag    uint64
	w0, w1 uint64 // a short key's words; 0 for a long key
}

// makeKey is the memKey of key, given its hash h and words a, b
// (keyhash.Hasher.StringWords), and the key itself if it is long ("" if it
// is short): what find and insert take.
func makeKey(key string, h, a, b uint64) (memKey, string) {
	n := uint64(min(len(key), keyhash.ShortLen+1))
	k := memKey{tag: 1<<63 | n<<58 | h&(1<<58-1), w0: a, w1: b}
	if len(key) > keyhash.ShortLen {
		return k, key
	}
	return k, ""
}

// frozen marks a slot whose table is being replaced. No clock reading is
// this far in the past, so no real TAT equals it.
const frozen = math.MinInt64

// countFull returns how many of s's keys are full at now (their TAT is at
// or before it). The caller holds s.mu.
func (s *memShard) countFull(now int64) int {
	full := 0
	if t := s.tab.Load(); t != nil {
		for j := range t.slots {
			if t.slots[j].tag.Load() != 0 && t.slots[j].tat.Load() <= now {
				full++
			}
		}
	}
	return full
}

// find returns the slot holding k (and long: see makeKey), or nil. t may be
// nil (no keys yet).
func (t *memTable) find(k memKey, long string) *memSlot {
	if t == nil {
		return nil
	}
	for i := k.tag >> 8; ; i++ { // the low 8 bits chose the shard
		j := i & t.mask
		slot := &t.slots[j]
		switch slot.tag.Load() {
		case 0:
			return nil
		case k.tag: // so the same length class: t.long is there if k is long
			if slot.w == [2]uint64{k.w0, k.w1} && (long == "" || t.long[j] == long) {
				return slot
			}
		}
	}
}

// insert puts a key that t does not hold into an empty slot. Callers own t:
// they hold its shard's lock, or t is not published yet; t.long is not nil
// if k is long (long is not "").
func (t *memTable) insert(k memKey, long string, tat int64) {
	for i := k.tag >> 8; ; i++ {
		j := i & t.mask
		slot := &t.slots[j]
		if slot.tag.Load() == 0 {
			slot.w = [2]uint64{k.w0, k.w1}
			if long != "" {
				t.long[j] = long
			}
			slot.tat.Store(tat)
			slot.tag.Store(k.tag) // publishes the words, the long key and tat to lock-free readers
			return
		}
	}
}

// keyAt is the key held in t's slot i, which is not empty, as makeKey
// returns it.
func (t *memTable) keyAt(i int) (k memKey, long string) {
	k = memKey{tag: t.slots[i].tag.Load(), w0: t.slots[i].w[0], w1: t.slots[i].w[1]}
	if t.long != nil {
		long = t.long[i]
	}
	return k, long
}

// newMemTable returns an empty table with room for n keys at most half full,
// or nil for n = 0; long says whether to make room for long keys.
func newMemTable(n int, long bool) *memTable {
	if n == 0 {
		return nil
	}
	size := 8
	for size < 2*n {
		size *= 2
	}
	t := &memTable{slots: make([]memSlot, size), mask: uint64(size - 1)}
	if long {
		t.long = make([]string, size)
	}
	return t
}

// replace moves s's keys into a new table with room for at least n keys,
// leaving out those for which drop (if not nil) reports true given their
// TAT, publishes it and returns it; it updates s.n. The caller holds s.mu.
//
// Every slot of the old table is frozen by the swap that reads its TAT, so
// a lock-free caller that found the key there fails its CAS, sees frozen and
// retries under the lock, in the new table: no update is lost between the
// read and the copy.
func (s *memShard) replace(n int, drop func(tat int64) bool) *memTable {
	old := s.tab.Load()
	t := newMemTable(n, s.long)
	kept := 0
	if old != nil {
		for i := range old.slots {
			slot := &old.slots[i]
			if slot.tag.Load() == 0 {
				continue
			}
			tat := slot.tat.Swap(frozen)
			if drop != nil && drop(tat) {
				continue
			}
			if t == nil {
				t = newMemTable(1, s.long)
			} else if uint64(kept+1) > (t.mask+1)/2 { // more survived than n: grow the private table
				t = t.grow()
			}
			k, long := old.keyAt(i)
			t.insert(k, long, tat)
			kept++
		}
	}
	s.n = kept
	s.tab.Store(t)
	return t
}

// grow returns an unpublished copy of the unpublished t at twice the size.
func (t *memTable) grow() *memTable {
	g := newMemTable(len(t.slots), t.long != nil)
	for i := range t.slots {
		if t.slots[i].tag.Load() != 0 {
			k, long := t.keyAt(i)
			g.insert(k, long, t.slots[i].tat.Load())
		}
	}
	return g
}
