package store

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/internal/gcra"
	"github.com/sluice-go/sluice/internal/keyhash"
	"github.com/sluice-go/sluice/internal/monotime"
	"github.com/sluice-go/sluice/internal/selfbound"
)

const memoryShards = 256 // a power of two; inserts and sweeps lock one shard at a time

// Memory is a Store that keeps buckets in this process. A decision on a key
// the store already holds takes no lock: it hashes the key once, finds its
// slot in an open-addressed table, reads the clock and updates the key's
// theoretical arrival time (TAT) with one compare-and-swap; a denial writes
// nothing. Only a new key takes a lock, that of one of 256 shards. Each key
// costs 64 to 160 bytes of table (a 32-byte slot in a table kept between a
// fifth and half full), and keys longer than 16 bytes are kept besides
// (16 more bytes a slot in the shards that hold one).
//
// A key whose bucket is full again holds no information (GCRA's "tat ≤ now":
// a key dropped then is decided exactly as one never seen), so the store
// forgets such keys by default, without a goroutine and without changing
// any decision: a key whose bucket has been full for a sweep interval
// (DefaultSweep, or WithSweep's) is dropped when its shard's table must
// grow, and by the calls themselves, which sweep the shards in turn, all
// 256 over each interval. So such a key is gone after at most one more
// interval of traffic, and the store holds about the keys used within the
// last interval or not yet full, never every key ever seen. Why the wait of
// an interval: a key that comes back soon is found again without the
// shard's lock, instead of being inserted again. WithSweep also runs a
// goroutine that sweeps every full key each interval of real time, which
// Close stops; WithSweep(0) turns all of it off (Sweep still works).
//
// Bound: the store holds at most DefaultMaxKeys keys (WithMaxKeys sets the
// cap): each of the 256 shards at most a 256th of it, rounded up. A new key
// that finds its shard at the cap after its full keys are dropped makes the
// shard forget an eighth of its keys, those nearest to full: they start
// full again on their next request (more than their share, never less, as
// sharedbucket's eviction). Evicted counts them. At the default cap the
// tables take at most 64 MiB (96 MiB if keys longer than 16 bytes reach
// every shard, plus those keys' bytes).
//
// Safe for concurrent use; the zero value is not usable (use NewMemory).
// Limits held here are per process; use the shm or Redis store to share them.
type Memory struct {
	//lint:ignore U1000 used through selfbound.Of's interface, which staticcheck cannot follow across packages
	inProcess                       // zero-size: Allow never waits, so callers skip per-call timeouts
	intervals  intervalCache        // first: at the start of the allocation, its entries start cache lines
	hk         keyhash.Hasher       // keyed with per-process random words, so nobody can choose keys that collide
	clock      func() time.Duration // WithClock's; nil means the store's own (see now)
	mono       bool                 // no WithClock, and made outside any synctest bubble: now reads monotime
	origin     int64                // NewMemory's reading of monotime.Now
	start      time.Time            // NewMemory's reading of time.Now (a bubble's fake time in one)
	sweepEvery time.Duration        // the sweep interval: DefaultSweep or WithSweep's; ≤ 0: no sweeping
	background bool                 // WithSweep was given: a goroutine sweeps too
	step       int64                // sweepEvery / memoryShards in ns: the calls sweep one shard per step
	shardCap   int                  // keys a shard may hold (0: no cap)
	sweepAt    atomic.Int64         // the store's time at which a call next sweeps a shard
	sweepNext  atomic.Uint64        // the shard the calls sweep next, modulo memoryShards
	evicted    atomic.Int64         // keys not full forgotten past the cap
	shards     [memoryShards]memShard
	closed     atomic.Bool

	stop      chan struct{}
	sweepDone chan struct{}
	closeOnce sync.Once
}

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

// intervalCache remembers the emission interval T of the rates a store saw
// last, so that a decision does not divide and round per call (Interval is
// a tenth of a hot-key decision). It holds intervalWays rates, placed by
// their bits; a rate that finds its place taken by another is computed and
// takes the place over. Lookups take no lock: each entry is a seqlock whose
// writers claim it with a compare-and-swap, and a reader that saw a write
// in progress or finished meanwhile computes T itself.
type intervalCache struct {
	ways [intervalWays]intervalEntry
}

const intervalWays = 8 // a power of two

type intervalEntry struct {
	seq  atomic.Uint64 // odd while a writer fills the entry
	rate atomic.Uint64 // math.Float64bits of the rate; 0 (never a valid rate) while empty
	t    atomic.Int64
	_    [40]byte // one entry per cache line: a writer does not slow the readers of other rates
}

// of returns Policy{Rate: rate}.Interval() in nanoseconds.
func (c *intervalCache) of(rate float64) int64 {
	bits := math.Float64bits(rate)
	e := &c.ways[(bits^bits>>32^bits>>45)&(intervalWays-1)]
	seq := e.seq.Load()
	if seq&1 == 0 && e.rate.Load() == bits {
		t := e.t.Load()
		if e.seq.Load() == seq {
			return t
		}
	}
	t := int64(Policy{Rate: rate}.Interval())
	if seq&1 == 0 && e.seq.CompareAndSwap(seq, seq+1) {
		e.rate.Store(bits)
		e.t.Store(t)
		e.seq.Store(seq + 2)
	}
	return t
}

// inProcess marks Memory for internal/selfbound.Of.
//
//lint:ignore U1000 used through selfbound.Of's interface, which staticcheck cannot follow across packages
type inProcess = selfbound.InProcess

// MemoryOption configures NewMemory.
type MemoryOption func(*Memory)

// DefaultSweep is a Memory store's sweep interval unless WithSweep says
// otherwise: a key whose bucket has been full this long is forgotten within
// this much more time of traffic.
const DefaultSweep = time.Minute

// DefaultMaxKeys is how many keys a Memory store holds at most unless
// WithMaxKeys says otherwise (see Memory for what happens past it).
const DefaultMaxKeys = 1 << 20

// WithSweep sets the sweep interval (DefaultSweep without it) and also
// makes a goroutine sweep the whole store every interval of real time,
// which Close stops: for a store that may sit idle with many keys, such as
// a server's. Zero or negative turns every sweep off: full keys then stay
// until Sweep is called, or until the cap (WithMaxKeys) evicts.
func WithSweep(interval time.Duration) MemoryOption {
	return func(m *Memory) {
		sweepInterval(interval)(m)
		m.background = interval > 0
	}
}

// sweepInterval sets the sweep interval alone, with no goroutine.
func sweepInterval(interval time.Duration) MemoryOption {
	return func(m *Memory) { m.sweepEvery = interval }
}

// WithMaxKeys caps the keys the store holds (DefaultMaxKeys without it);
// zero or negative means no cap. See Memory for the rule past the cap.
func WithMaxKeys(n int) MemoryOption {
	return func(m *Memory) {
		m.shardCap = 0
		if n > 0 {
			m.shardCap = (n + memoryShards - 1) / memoryShards
		}
	}
}

// WithClock replaces the store's clock with now, which must return
// nanoseconds that never go backwards. For tests that drive time by hand.
func WithClock(now func() time.Duration) MemoryOption {
	return func(m *Memory) { m.clock = now }
}

// NewMemory returns an empty Memory store.
func NewMemory(opts ...MemoryOption) *Memory {
	m := &Memory{hk: keyhash.New(rand.Uint64(), rand.Uint64()), origin: monotime.Now(), start: time.Now(),
		sweepEvery: DefaultSweep, shardCap: (DefaultMaxKeys + memoryShards - 1) / memoryShards}
	for _, o := range opts {
		o(m)
	}
	m.mono = m.clock == nil && !monotime.Bubbled()
	if m.sweepEvery > 0 {
		m.step = max(1, int64(m.sweepEvery/memoryShards))
		m.sweepAt.Store(m.now() + m.step)
	}
	if m.background { // started after every option, so it sees the final clock
		m.stop = make(chan struct{})
		m.sweepDone = make(chan struct{})
		go m.sweepLoop(m.sweepEvery)
	}
	return m
}

// now is the store's clock in nanoseconds.
func (m *Memory) now() int64 {
	// Why the monotonic clock alone: time.Now also reads wall time, and
	// time.Since asks on every call whether the caller is in a synctest
	// bubble; wall-clock steps never refill or drain a bucket.
	if m.mono {
		return monotime.Now() - m.origin
	}
	return m.otherNow()
}

// otherNow is now for a store with WithClock's clock, or one made in a
// synctest bubble, which keeps the bubble's fake time (time.Since is that
// there).
func (m *Memory) otherNow() int64 {
	if m.clock != nil {
		return int64(m.clock())
	}
	return int64(time.Since(m.start))
}

// Allow implements Store. It never blocks on I/O and ignores ctx.
func (m *Memory) Allow(_ context.Context, key string, cost int64, p Policy) (Result, error) {
	if m.closed.Load() {
		return Result{}, ErrClosed
	}
	if cost < 1 || cost > p.Burst {
		return Result{}, Check(cost, p)
	}
	T := m.intervals.of(p.Rate)
	tau, need := T*p.Burst, cost*T
	room := tau - need // computed once: see gcra.Step
	// One hash serves both the shard (its low bits) and the slot (the rest).
	h, a, b := m.hk.StringWords(key)
	s := &m.shards[h&(memoryShards-1)]
	k, long := makeKey(key, h, a, b)
	// Why the clock is read before the lookup and under no lock: a caller
	// whose reading is older than the TAT another caller just wrote is only
	// stricter (max(tat, now) + cost·T − now grows as now shrinks), and each
	// allowed call still moves the TAT to at least its own now + cost·T, so
	// the bound burst + (e−s)/T holds for every interleaving. Read first, it
	// overlaps the table's cache misses instead of waiting for them.
	now := m.now()
	if m.step > 0 && now >= m.sweepAt.Load() {
		m.sweepDue(now)
	}
	if slot := s.tab.Load().find(k, long); slot != nil {
		for {
			tat := slot.tat.Load()
			if tat == frozen {
				break // the table is being replaced: take the lock
			}
			next, ok := gcra.Step(tat, now, need, room)
			if !ok || slot.tat.CompareAndSwap(tat, next) {
				return Result(gcra.Figures(ok, next-now, need, T, tau)), nil
			}
		}
	}
	return m.allowLocked(s, k, long, need, T, tau), nil
}

// allowLocked decides for a key the lock-free path could not: one not in
// the table yet, or one whose table was being replaced.
func (m *Memory) allowLocked(s *memShard, k memKey, long string, need, T, tau int64) Result {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Why the clock is read under the lock here: a sweep reads its own now
	// under the same lock and drops only keys with tat ≤ that now, so a key
	// created after the sweep starts from a TAT at least as late as the one
	// the sweep dropped (a reading taken before the sweep could be earlier,
	// and would hand a drained bucket a refill it never earned).
	now := m.now()
	if slot := s.tab.Load().find(k, long); slot != nil {
		for { // never frozen here: only holders of the lock freeze, and they publish the new table first
			tat := slot.tat.Load()
			next, ok := gcra.Step(tat, now, need, tau-need)
			if !ok || slot.tat.CompareAndSwap(tat, next) {
				return Result(gcra.Figures(ok, next-now, need, T, tau))
			}
		}
	}
	next, ok := gcra.Step(now, now, need, tau-need) // a key never seen is full
	r := Result(gcra.Figures(ok, next-now, need, T, tau))
	if !ok {
		return r
	}
	t := s.tab.Load()
	grow := t == nil || uint64(s.n+1) > (t.mask+1)/2
	over := m.shardCap > 0 && s.n+1 > m.shardCap
	if (grow || over) && m.step > 0 {
		// The table is about to be rebuilt (or the shard is at its cap):
		// first forget the keys full for a sweep interval, so the table
		// grows only with keys that hold something or were used lately.
		// Sized with a quarter to spare, so a shard of mostly idle keys is
		// not rebuilt again at the next insert.
		idle := now - int64(m.sweepEvery)
		if full := s.countFull(idle); full > 0 {
			kept := s.n - full
			room := kept + 1 + kept/4
			if m.shardCap > 0 {
				room = min(room, max(kept+1, m.shardCap)) // no table beyond what the cap needs
			}
			t = s.replace(room, func(tat int64) bool { return tat <= idle })
			grow, over = false, m.shardCap > 0 && s.n+1 > m.shardCap
		}
	}
	for over { // again only if spends raced the eviction (see evict)
		t, grow = m.evict(s, now), false
		over = s.n+1 > m.shardCap
	}
	if long != "" && !s.long {
		s.long = true // and a new table, with room for long keys
		t = s.replace(s.n+1, nil)
	} else if grow || uint64(s.n+1) > (t.mask+1)/2 {
		t = s.replace(s.n+1, nil)
	}
	t.insert(k, long, next)
	s.n++
	return r
}

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

// evict makes room in s, which is at its cap: it forgets an eighth of the
// cap (at least one key), those with the earliest TATs, nearest to full,
// counts those that were not full at now, and returns the new table. The
// caller holds s.mu.
//
// Why an eighth at once: a rebuild costs the whole table, so evicting one
// key per new key would cost a table per request to anyone who rotates
// keys; an eighth makes it a few nanoseconds a key.
func (m *Memory) evict(s *memShard, now int64) *memTable {
	t := s.tab.Load()
	tats := make([]int64, 0, s.n)
	for j := range t.slots {
		if t.slots[j].tag.Load() != 0 {
			tats = append(tats, t.slots[j].tat.Load())
		}
	}
	drop := min(len(tats), max(1, s.n+1-m.shardCap+m.shardCap/8))
	slices.Sort(tats)
	// Drop every TAT below the threshold and as many equal to it as the
	// count leaves (ties: keys spent at one instant). A TAT only grows, so
	// one read here may be above the threshold then: the key stays, and
	// fewer are dropped, never more.
	th := tats[drop-1]
	ties := 0
	for _, v := range tats[:drop] {
		if v == th {
			ties++
		}
	}
	evicted := int64(0)
	t = s.replace(s.n, func(tat int64) bool {
		drop := tat < th
		if tat == th && ties > 0 {
			ties--
			drop = true
		}
		if drop && tat > now {
			evicted++
		}
		return drop
	})
	m.evicted.Add(evicted)
	return t
}

// Evicted returns how many keys whose buckets were not full the store has
// forgotten to stay within its cap (WithMaxKeys).
func (m *Memory) Evicted() int64 { return m.evicted.Load() }

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

// Sweep deletes every key whose bucket is full now and reports how many it
// deleted. The store's decisions are the same with or without a sweep.
func (m *Memory) Sweep() int {
	n := 0
	for i := range m.shards {
		n += m.sweepShard(&m.shards[i], 0)
	}
	return n
}

// sweepShard deletes s's keys that have been full for idle nanoseconds or
// more and returns how many.
func (m *Memory) sweepShard(s *memShard, idle int64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	// now is read under the lock (see allowLocked); a cutoff before it
	// drops fewer keys, and a key full then is full now.
	cut := m.now() - idle
	full := s.countFull(cut)
	if full == 0 {
		return 0
	}
	// A key counted full may be spent before replace reads it (then it
	// stays), never the other way round: a TAT only grows.
	before := s.n
	s.replace(s.n-full, func(tat int64) bool { return tat <= cut })
	return before - s.n
}

// sweepDue sweeps the next shard for a call that found the calls' sweep
// due at now; of the callers that find it due at once, one sweeps.
//
// Why at most one interval behind: after the store sat idle, the calls
// catch up one shard each, a whole round at most, instead of one per step
// of the idle time.
func (m *Memory) sweepDue(now int64) {
	at := m.sweepAt.Load()
	if now < at || !m.sweepAt.CompareAndSwap(at, max(at, now-int64(m.sweepEvery))+m.step) {
		return
	}
	m.sweepShard(&m.shards[(m.sweepNext.Add(1)-1)&(memoryShards-1)], int64(m.sweepEvery))
}

func (m *Memory) sweepLoop(interval time.Duration) {
	defer close(m.sweepDone)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
			m.Sweep()
		}
	}
}

// Keys implements Store: the number of keys held, full ones not yet swept
// included.
func (m *Memory) Keys(context.Context) (int64, error) {
	var n int64
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		n += int64(s.n)
		s.mu.Unlock()
	}
	return n, nil
}

// Ping implements Store; it fails only after Close.
func (m *Memory) Ping(context.Context) error {
	if m.closed.Load() {
		return ErrClosed
	}
	return nil
}

// Name implements Store.
func (m *Memory) Name() string { return "memory" }

// Close stops the sweep and makes later calls return ErrClosed. It is safe to
// call more than once.
func (m *Memory) Close() error {
	m.closeOnce.Do(func() {
		m.closed.Store(true)
		if m.stop != nil {
			close(m.stop)
			<-m.sweepDone
		}
	})
	return nil
}
