package service

import (
	"cmp"
	"slices"
	"strings"
	"sync"
)

// HeavyCounters is how many keys one Space-Saving summary tracks (k). A
// summary of a stream of N denials reports every key denied more than N/k
// times, and each count it reports is at most N/k above the truth.
const HeavyCounters = 32

// heavyKeyMax bounds the bytes of a key a summary keeps; longer keys are
// kept as their first heavyKeyMax bytes followed by "…". The service's store
// keys are at most 256 bytes plus a rule's prefix, so this rarely cuts.
const heavyKeyMax = 320

// spaceSaving is the Space-Saving summary of Metwally, Agrawal and El
// Abbadi (2005) with HeavyCounters counters: a key already tracked gets +1;
// a new key takes over the counter with the smallest count c, starting at
// c+1 with error c. So each count overestimates its key's true count by at
// most its err, and err ≤ N/k for a stream of N. The zero value is empty and
// ready; it is not safe for concurrent use (heavyHitters locks).
//
// Memory is fixed: k counters and an index of at most k keys. Counting a
// key already tracked allocates nothing (the map lookup with a string key
// does not); a new key costs one copy of it (strings.Clone, at most
// heavyKeyMax bytes) so that the summary never pins a request's buffer.
type spaceSaving struct {
	n     int    // counters in use
	total uint64 // N: every key counted
	c     [HeavyCounters]heavyCounter
	index map[string]int // key → position in c
}

type heavyCounter struct {
	key        string
	count, err uint64
}

func (s *spaceSaving) reset() {
	s.n, s.total = 0, 0
	clear(s.index)
	s.c = [HeavyCounters]heavyCounter{}
}

// incr counts key if it is tracked and reports whether it was; a key not
// tracked is left to add.
func (s *spaceSaving) incr(key string) bool {
	i, ok := s.index[key]
	if ok {
		s.total++
		s.c[i].count++
	}
	return ok
}

// add counts key, which must not be tracked (incr said so), taking a free
// counter or the smallest one over. The summary keeps key as given: the
// caller owns it (heavyHitters.add copies it first, once for both windows).
func (s *spaceSaving) add(key string) {
	s.total++
	if s.index == nil {
		s.index = make(map[string]int, HeavyCounters)
	}
	if s.n < HeavyCounters {
		s.c[s.n] = heavyCounter{key: key, count: 1}
		s.index[key] = s.n
		s.n++
		return
	}
	// Why a linear scan for the minimum: k is 32, so the scan is a few
	// dozen compares, only for a key not yet tracked, on the denial path.
	m := 0
	for i := 1; i < HeavyCounters; i++ {
		if s.c[i].count < s.c[m].count {
			m = i
		}
	}
	delete(s.index, s.c[m].key)
	least := s.c[m].count
	s.c[m] = heavyCounter{key: key, count: least + 1, err: least}
	s.index[key] = m
}

// minCount is the smallest count when every counter is in use, else 0: an
// untracked key was seen at most this often.
func (s *spaceSaving) minCount() uint64 {
	if s.n < HeavyCounters {
		return 0
	}
	m := s.c[0].count
	for i := 1; i < s.n; i++ {
		m = min(m, s.c[i].count)
	}
	return m
}

// heavyWindows is a ring of Space-Saving summaries, one per span of width
// nanoseconds; a summary older than the ring is reset before reuse.
type heavyWindows struct {
	// cur is the summary of the span [curFrom, curTo): most denials fall
	// in the span of the one before, and skip the divisions.
	cur            *spaceSaving
	curFrom, curTo int64

	width int64
	epoch [heavyRing]int64 // which span each summary counts; -1 none
	sum   [heavyRing]spaceSaving
	n     int // summaries in the ring (≤ heavyRing)
}

const heavyRing = 5

func (w *heavyWindows) init(width int64, n int) {
	w.width, w.n = width, n
	for i := range w.epoch {
		w.epoch[i] = -1
	}
}

// current returns the summary of the span now falls in, reset if it last
// counted an older span.
func (w *heavyWindows) current(now int64) *spaceSaving {
	if now >= w.curFrom && now < w.curTo && w.cur != nil {
		return w.cur
	}
	e := now / w.width
	i := int(e % int64(w.n))
	if w.epoch[i] != e {
		w.sum[i].reset()
		w.epoch[i] = e
	}
	w.cur, w.curFrom, w.curTo = &w.sum[i], e*w.width, (e+1)*w.width
	return w.cur
}

// HeavyKey is one key of a top list: Count is an upper bound of its
// denials in the window, and at least Count-Err of them are certain.
type HeavyKey struct {
	Key   string `json:"key"`
	Count uint64 `json:"count"`
	Err   uint64 `json:"err"`
}

// top merges the summaries of the spans that overlap the last n·width
// nanoseconds (the current span and the n-1 before it) and returns the
// limit keys with the highest counts, and N, the denials they summarise.
// A key a summary does not track may have been denied up to that summary's
// minimum there, which goes into its Err: merged, the bound stays N/k.
func (w *heavyWindows) top(now int64, limit int) ([]HeavyKey, uint64) {
	e := now / w.width
	merged := map[string]*HeavyKey{}
	var total uint64
	var live []*spaceSaving
	for i := 0; i < w.n; i++ {
		if w.epoch[i] < 0 || w.epoch[i] <= e-int64(w.n) || w.epoch[i] > e {
			continue
		}
		s := &w.sum[i]
		live = append(live, s)
		total += s.total
		for _, c := range s.c[:s.n] {
			h := merged[c.key]
			if h == nil {
				h = &HeavyKey{Key: c.key}
				merged[c.key] = h
			}
			h.Count += c.count
			h.Err += c.err
		}
	}
	out := make([]HeavyKey, 0, len(merged))
	for _, h := range merged {
		// The summaries that do not track h's key may each hide up to
		// their minimum of its denials.
		for _, s := range live {
			if _, ok := s.index[h.Key]; !ok {
				m := s.minCount()
				h.Count += m
				h.Err += m
			}
		}
		out = append(out, *h)
	}
	slices.SortFunc(out, func(a, b HeavyKey) int {
		if c := cmp.Compare(b.Count-b.Err, a.Count-a.Err); c != 0 { // surest first
			return c
		}
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	if len(out) > limit {
		out = out[:limit]
	}
	return out, total
}

// heavyHitters are one policy's most denied keys over the last minute
// (four spans of 15 s) and the last 15 minutes (five spans of 3 min). Safe
// for concurrent use: one small lock, taken only on denials and by the page.
// Memory is fixed once made: 9 summaries of HeavyCounters counters (32 B
// each) and an index of as many keys, and the keys, each at most
// heavyKeyMax bytes: about 28 KiB with keys as short as IP addresses, at
// most about 120 KiB. It is made at the policy's first denial.
type heavyHitters struct {
	mu      sync.Mutex
	minute  heavyWindows
	quarter heavyWindows
}

// Spans of the two top lists.
const (
	heavyMinuteSpan  = 15e9  // ns; 4 spans: the last 45 to 60 s
	heavyQuarterSpan = 180e9 // ns; 5 spans: the last 12 to 15 min
)

func newHeavyHitters() *heavyHitters {
	h := &heavyHitters{}
	h.minute.init(heavyMinuteSpan, 4)
	h.quarter.init(heavyQuarterSpan, 5)
	return h
}

func (h *heavyHitters) add(now int64, key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m, q := h.minute.current(now), h.quarter.current(now)
	inM, inQ := m.incr(key), q.incr(key)
	if inM && inQ {
		return // the usual case under abuse: two map lookups, no allocation
	}
	// A new entry keeps the key: copy it (once for both windows), so that
	// the sketch never pins the request's buffer, and cut a long one.
	if len(key) > heavyKeyMax {
		key = key[:heavyKeyMax] + "…"
		if inM = m.incr(key); inM && inQ {
			return
		}
		if inQ = q.incr(key); inM && inQ {
			return
		}
	} else {
		key = strings.Clone(key)
	}
	if !inM {
		m.add(key)
	}
	if !inQ {
		q.add(key)
	}
}

func (h *heavyHitters) top(now int64, limit int) (minute []HeavyKey, minuteN uint64, quarter []HeavyKey, quarterN uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	minute, minuteN = h.minute.top(now, limit)
	quarter, quarterN = h.quarter.top(now, limit)
	return
}
