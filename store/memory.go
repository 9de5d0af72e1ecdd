package store

import (
	"context"
	"math/rand/v2"
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

// Evicted returns how many keys whose buckets were not full the store has
// forgotten to stay within its cap (WithMaxKeys).
func (m *Memory) Evicted() int64 { return m.evicted.Load() }

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
