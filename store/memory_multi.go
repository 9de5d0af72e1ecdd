package store

import (
	"context"
	"time"

	"github.com/sluice-go/sluice/internal/gcra"
)

// DecideAll implements AllOrNothing. With spend it decides each request as
// Allow does and, if any is denied, gives back what the allowed ones spent
// (their TATs move back by what each added), so the buckets end as if the
// request had not come. Between a spend and its give-back a concurrent
// caller may find a bucket a little emptier than it is, and be denied where
// it would have passed: only ever stricter, never more than the bound. A
// key a sweep dropped meanwhile (its bucket was full again) needs nothing
// given back. It never blocks on I/O and ignores ctx.
func (m *Memory) DecideAll(ctx context.Context, reqs []Request, spend bool, out []Result) (bool, error) {
	if m.closed.Load() {
		return false, ErrClosed
	}
	for _, r := range reqs {
		if err := Check(r.Cost, r.Policy); err != nil {
			return false, err
		}
	}
	if !spend {
		m.look(reqs, out)
		return false, nil
	}
	all := true
	for i, r := range reqs {
		out[i], _ = m.Allow(ctx, r.Key, r.Cost, r.Policy)
		all = all && out[i].Allowed
	}
	if all {
		return true, nil
	}
	for i := len(reqs) - 1; i >= 0; i-- {
		if !out[i].Allowed {
			continue
		}
		r := reqs[i]
		T := m.intervals.of(r.Policy.Rate)
		need := r.Cost * T
		m.giveBack(r.Key, need)
		// The figures of the bucket as it stands again: need less debt.
		o := &out[i]
		o.Remaining = min(o.Remaining+float64(r.Cost), float64(r.Policy.Burst))
		o.ResetAfter = max(o.ResetAfter-time.Duration(need), 0)
	}
	return false, nil
}

// look fills out with what each request would get, spending nothing;
// requests on the same key count the ones before them.
func (m *Memory) look(reqs []Request, out []Result) {
	now := m.now()
	var debts map[string]int64 // what earlier requests of this call would add
	if len(reqs) > 1 {
		debts = make(map[string]int64, len(reqs))
	}
	for i, r := range reqs {
		T := m.intervals.of(r.Policy.Rate)
		tau, need := T*r.Policy.Burst, r.Cost*T
		h, a, b := m.hk.StringWords(r.Key)
		s := &m.shards[h&(memoryShards-1)]
		k, long := makeKey(r.Key, h, a, b)
		var tat int64 = now
		if slot := s.tab.Load().find(k, long); slot != nil {
			if t := slot.tat.Load(); t != frozen {
				tat = t
			}
		}
		debt := gcra.Debt(tat, now) + debts[r.Key]
		ok := debt+need <= tau
		if ok && debts != nil {
			debts[r.Key] += need
		}
		out[i] = Result(gcra.Figures(ok, debt, need, T, tau))
	}
}

// giveBack moves key's TAT back by need, undoing an allowed Allow.
func (m *Memory) giveBack(key string, need int64) {
	h, a, b := m.hk.StringWords(key)
	s := &m.shards[h&(memoryShards-1)]
	k, long := makeKey(key, h, a, b)
	if slot := s.tab.Load().find(k, long); slot != nil {
		for {
			tat := slot.tat.Load()
			if tat == frozen {
				break // the table is being replaced: under the lock below
			}
			if slot.tat.CompareAndSwap(tat, tat-need) {
				return
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if slot := s.tab.Load().find(k, long); slot != nil {
		slot.tat.Add(-need) // never frozen under the lock
	}
}

// AllowEach implements Batch as Allow for each request in turn: in process
// there is no round trip to save. Why implement it at all: callers such as
// `sluice serve` then take their one-call path on every store alike, so
// what it answers is held to the same tests on the memory store as on
// Redis. It never blocks and ignores ctx.
func (m *Memory) AllowEach(ctx context.Context, reqs []Request, out []Result, errs []error) {
	allowEach(ctx, m, reqs, out, errs)
}
