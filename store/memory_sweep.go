package store

import (
	"slices"
	"time"
)

// How a Memory store forgets keys: sweeps drop keys whose buckets have
// been full for an interval (no decision changes), and a shard at its cap
// evicts those nearest to full (see Memory).

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
