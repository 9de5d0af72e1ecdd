package store

import (
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

const memoryShards = 256 // a power of two; enough that 2 cores rarely meet on one lock

// Memory is a Store that keeps buckets in this process: a map split into 256
// shards, each with its own mutex, so there is no global lock. A key whose
// bucket is full again holds no information (GCRA's "tat ≤ now"), so a
// periodic sweep deletes such keys without changing any future decision.
//
// Safe for concurrent use; the zero value is not usable (use NewMemory).
// Limits held here are per process; use the shm or Redis store to share them.
type Memory struct {
	seed   maphash.Seed
	now    func() int64 // nanoseconds on a monotonic clock
	shards [memoryShards]memShard
	closed atomic.Bool

	stop      chan struct{}
	sweepDone chan struct{}
	closeOnce sync.Once
}

type memShard struct {
	mu  sync.Mutex
	tat map[string]int64 // guarded by mu; theoretical arrival time per key
	_   [40]byte         // keep neighbouring shards' locks off one cache line
}

// MemoryOption configures NewMemory.
type MemoryOption func(*Memory)

// WithSweep makes the store delete full (idle) buckets every interval in a
// background goroutine that Close stops. Zero or negative disables the sweep.
func WithSweep(interval time.Duration) MemoryOption {
	return func(m *Memory) {
		if interval > 0 {
			m.stop = make(chan struct{})
			m.sweepDone = make(chan struct{})
			go m.sweepLoop(interval)
		}
	}
}

// WithClock replaces the store's clock with now, which must return
// nanoseconds that never go backwards. For tests that drive time by hand.
func WithClock(now func() time.Duration) MemoryOption {
	return func(m *Memory) { m.now = func() int64 { return int64(now()) } }
}

// NewMemory returns an empty Memory store.
func NewMemory(opts ...MemoryOption) *Memory {
	start := time.Now()
	m := &Memory{seed: maphash.MakeSeed()}
	// Why time.Since: it reads the monotonic clock, so wall-clock steps never
	// refill or drain a bucket.
	m.now = func() int64 { return int64(time.Since(start)) }
	for i := range m.shards {
		m.shards[i].tat = make(map[string]int64)
	}
	for _, o := range opts {
		o(m)
	}
	return m
}

func (m *Memory) shard(key string) *memShard {
	return &m.shards[maphash.String(m.seed, key)&(memoryShards-1)]
}

// Allow implements Store. It never blocks on I/O and ignores ctx.
func (m *Memory) Allow(_ context.Context, key string, cost int64, p Policy) (Result, error) {
	if m.closed.Load() {
		return Result{}, ErrClosed
	}
	if err := Check(cost, p); err != nil {
		return Result{}, err
	}
	T := int64(p.Interval())
	tau := T * p.Burst
	s := m.shard(key)
	s.mu.Lock()
	now := m.now() // read under the lock so decisions on one key see time in order
	tat, ok := s.tat[key]
	if !ok {
		tat = now
	}
	next, r := Decide(tat, now, cost, T, tau)
	if r.Allowed {
		s.tat[key] = next
	}
	s.mu.Unlock()
	return r, nil
}

// Sweep deletes every key whose bucket is full now and reports how many it
// deleted. The store's decisions are the same with or without a sweep.
func (m *Memory) Sweep() int {
	n := 0
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		now := m.now()
		for k, tat := range s.tat {
			if tat <= now {
				delete(s.tat, k)
				n++
			}
		}
		s.mu.Unlock()
	}
	return n
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
		n += int64(len(s.tat))
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

// InProcess marks Memory as a store.InProcess store.
func (m *Memory) InProcess() {}
