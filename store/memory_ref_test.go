package store_test

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/sluice-go/sluice/internal/gcra"
	"github.com/sluice-go/sluice/store"
)

// mapMemory is the Memory store as it was before the lock-free table: 256
// mutex-guarded Go maps of key → TAT, the clock read under the shard's lock.
// It is the oracle of the differential test (same clock, same calls, the
// same results) and the same-run baseline of the benchmarks.
type mapMemory struct {
	seed   maphash.Seed
	now    func() int64
	shards [256]struct {
		mu  sync.Mutex
		tat map[string]int64 // guarded by mu
		_   [40]byte
	}
}

func newMapMemory(now func() time.Duration) *mapMemory {
	m := &mapMemory{seed: maphash.MakeSeed()}
	if now == nil {
		start := time.Now()
		now = func() time.Duration { return time.Since(start) }
	}
	m.now = func() int64 { return int64(now()) }
	for i := range m.shards {
		m.shards[i].tat = make(map[string]int64)
	}
	return m
}

func (m *mapMemory) Allow(key string, cost int64, p store.Policy) (store.Result, error) {
	if err := store.Check(cost, p); err != nil {
		return store.Result{}, err
	}
	T := int64(p.Interval())
	s := &m.shards[maphash.String(m.seed, key)&255]
	s.mu.Lock()
	defer s.mu.Unlock()
	now := m.now()
	tat, ok := s.tat[key]
	if !ok {
		tat = now
	}
	next, ok := gcra.Step(tat, now, cost*T, T*p.Burst-cost*T)
	if ok {
		s.tat[key] = next
	}
	return store.Result(gcra.Figures(ok, next-now, cost*T, T, T*p.Burst)), nil
}

func (m *mapMemory) Sweep() int {
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

func (m *mapMemory) Keys() int64 {
	var n int64
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		n += int64(len(s.tat))
		s.mu.Unlock()
	}
	return n
}
