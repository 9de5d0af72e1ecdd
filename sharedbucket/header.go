package sharedbucket

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"time"
)

// File format, version 4. All integers little-endian at 8-byte offsets.
//
//	0    magic "SLUICEBT"
//	8    format version (4)
//	16   header size (4096)
//	24   slot size (16)
//	32   slot count (a power of two)
//	40   slots offset (4096)
//	48   total file size
//	56   clock id (1 = Linux CLOCK_MONOTONIC, 2 = macOS mach_absolute_time)
//	64   boot id (16 bytes)
//	80   T, ns per token
//	88   b, burst in tokens
//	96   Limit as asked by the creator (display only)
//	104  Window as asked by the creator, ns (display only)
//	112  probe window (8)
//	120  hash id (2 = the keyed multiply-fold of hash.go)
//	128  hash key (16 bytes, random per file)
//	144  creation nonce (16 bytes, random)
//	160  creation wall time, Unix ns
//	168  CRC-32C of bytes [0, 168)
//
// The header is immutable once the file has a name. Bytes [2048, 4096) of
// the first page hold 256 floor words (int64 clock readings, see
// Table.claim); the rest is reserved. Slots follow at 4096: {key uint64, tat
// int64}, where key is the keyed hash of the key (0 = empty; top bit set: a
// lock word, see lockWord) and tat is the theoretical arrival time in ns of
// the clock named at 56 (≤ now means a full bucket).
//
// Who may write the file: every process that can open it for writing (its
// owner's, or a group's granted by WithMode), and each may change any
// bucket. The creator writes the header once, before the file has a name;
// after that only the slots and floors change, and only through the slot
// protocol. Anything else written there is damage, which the package doc
// ("Files") bounds: at most a burst for one key per damaged word, impossible
// words reset and counted (Stats.Corrupt), never a key without a limit.
//
// Versions: 2 changed the slot protocol (key words of 63 bits, a lock bit,
// floors); 3 changed the hash (SipHash-1-3, hash id 1, to hash id 2), which
// decides both where a key lives and the key word stored for it; 4 changed
// the lock word (the old owner's hash, to the locker's time and process id),
// so that a lock whose holder died can be taken over. Processes of two
// versions would split a key's limit (3 and 4: would each wait for the
// other's locks for ever or take them over at once), so a file of any other
// version is refused with ErrVersion, never read.
const (
	magic         = "SLUICEBT"
	formatVersion = 4
	headerSize    = 4096
	slotSize      = 16
	hashMulFold   = 2 // hash id, see hasher
	probeWindow   = 8
	crcOffset     = 168
	floorsOffset  = 2048
	floorCount    = 256
	clockLinux    = 1 // CLOCK_MONOTONIC
	clockDarwin   = 2 // mach_absolute_time in ns (CLOCK_UPTIME_RAW)
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// header is the decoded, validated first page of a table file.
type header struct {
	slots   int
	total   int64
	boot    [16]byte
	canon   canon
	limit   int64
	window  time.Duration
	k0, k1  uint64
	nonce   [16]byte
	created int64
	clock   int64 // clock id
}

func (h *header) encode() []byte {
	buf := make([]byte, headerSize)
	le := binary.LittleEndian
	copy(buf[0:8], magic)
	le.PutUint64(buf[8:], formatVersion)
	le.PutUint64(buf[16:], headerSize)
	le.PutUint64(buf[24:], slotSize)
	le.PutUint64(buf[32:], uint64(h.slots))
	le.PutUint64(buf[40:], headerSize)
	le.PutUint64(buf[48:], uint64(h.total))
	le.PutUint64(buf[56:], uint64(h.clock))
	copy(buf[64:80], h.boot[:])
	le.PutUint64(buf[80:], uint64(h.canon.interval))
	le.PutUint64(buf[88:], uint64(h.canon.burst))
	le.PutUint64(buf[96:], uint64(h.limit))
	le.PutUint64(buf[104:], uint64(h.window))
	le.PutUint64(buf[112:], probeWindow)
	le.PutUint64(buf[120:], hashMulFold)
	le.PutUint64(buf[128:], h.k0)
	le.PutUint64(buf[136:], h.k1)
	copy(buf[144:160], h.nonce[:])
	le.PutUint64(buf[160:], uint64(h.created))
	le.PutUint32(buf[crcOffset:], crc32.Checksum(buf[:crcOffset], castagnoli))
	return buf
}

// decodeHeader validates buf (the first headerSize bytes of a file). Every
// failure wraps ErrCorrupt and says what was wrong.
func decodeHeader(buf []byte) (*header, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
	}
	version := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrVersion, fmt.Sprintf(format, args...))
	}
	if len(buf) < headerSize {
		return nil, bad("header is %d bytes, want %d", len(buf), headerSize)
	}
	if string(buf[0:8]) != magic {
		return nil, bad("bad magic %q (not a sharedbucket table)", buf[0:8])
	}
	le := binary.LittleEndian
	if v := le.Uint64(buf[8:]); v != formatVersion {
		// Why refuse rather than convert: processes of the other version may
		// be using the file right now, and they would place keys elsewhere.
		if v < formatVersion {
			return nil, version("format version %d, this code reads %d: a table made by an older version, whose processes hash keys or lock slots differently; "+
				"stop every process using it, remove the file, and run them all on this version", v, formatVersion)
		}
		return nil, version("format version %d, this code reads %d: a table made by a newer version; "+
			"run every process that shares it on one version (or remove the file once none uses it)", v, formatVersion)
	}
	if got, want := le.Uint32(buf[crcOffset:]), crc32.Checksum(buf[:crcOffset], castagnoli); got != want {
		return nil, bad("header checksum %08x, computed %08x", got, want)
	}
	h := &header{
		slots:   int(le.Uint64(buf[32:])),
		total:   int64(le.Uint64(buf[48:])),
		canon:   canon{interval: int64(le.Uint64(buf[80:])), burst: int64(le.Uint64(buf[88:]))},
		limit:   int64(le.Uint64(buf[96:])),
		window:  time.Duration(le.Uint64(buf[104:])),
		k0:      le.Uint64(buf[128:]),
		k1:      le.Uint64(buf[136:]),
		created: int64(le.Uint64(buf[160:])),
		clock:   int64(le.Uint64(buf[56:])),
	}
	copy(h.boot[:], buf[64:80])
	copy(h.nonce[:], buf[144:160])
	switch {
	case le.Uint64(buf[16:]) != headerSize, le.Uint64(buf[40:]) != headerSize:
		return nil, bad("header size %d / slots offset %d", le.Uint64(buf[16:]), le.Uint64(buf[40:]))
	case le.Uint64(buf[24:]) != slotSize:
		return nil, bad("slot size %d", le.Uint64(buf[24:]))
	case h.slots < minSlots || h.slots > MaxSlots || h.slots&(h.slots-1) != 0:
		return nil, bad("slot count %d is not a power of two in [%d, %d]", h.slots, minSlots, MaxSlots)
	case h.total != headerSize+int64(h.slots)*slotSize:
		return nil, bad("total size %d for %d slots", h.total, h.slots)
	case h.clock != clockLinux && h.clock != clockDarwin:
		return nil, bad("clock id %d", h.clock)
	case le.Uint64(buf[112:]) != probeWindow, le.Uint64(buf[120:]) != hashMulFold:
		return nil, bad("probe window %d / hash id %d", le.Uint64(buf[112:]), le.Uint64(buf[120:]))
	case h.canon.interval < 1 || h.canon.burst < 1 || h.canon.interval > (maxTau-1)/h.canon.burst:
		return nil, bad("policy T=%d b=%d", h.canon.interval, h.canon.burst)
	}
	return h, nil
}
