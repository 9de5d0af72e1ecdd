package service

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
	"github.com/sluice-go/sluice/internal/monotime"
	"github.com/sluice-go/sluice/store"
)

// The page's history: 90 buckets of 10 s, the last 15 minutes.
const (
	uiBucket  = 10 * time.Second
	uiBuckets = 90
	// uiLatencyRing snapshots of the store latency histogram, one per
	// sample: quantiles over the last minute.
	uiLatencyRing = 61
	uiOutages     = 8 // outages remembered
)

// uiPolicy is what the page knows of one policy. The decision path adds to
// the four cumulative counters (one atomic add per decision, no lock, no
// allocation) and, on a denial, to the heavy-hitters sketch; everything
// else is written by the sampler (uiStats.tick) under uiStats.mu.
type uiPolicy struct {
	n [uiResults]atomic.Uint64 // cumulative, by uiResult
	// Why padding: the counters of one policy are written by every core
	// deciding for it; keep other policies' counters off their cache line.
	_ [64 - uiResults*8%64]byte

	hh    atomic.Pointer[heavyHitters] // made at the policy's first denial
	stats *uiStats                     // for its coarse clock

	// Set at registration; read-only after.
	kind, name, domain, path, where, per string
	rate                                 float64
	burst                                int64
	limited                              bool

	// Written by tick under uiStats.mu.
	last    [uiResults]uint64  // cumulative at the last sample
	rateNow [uiResults]float64 // per second over the last sample interval
	hist    [uiBuckets][uiResults]uint32
	epoch   [uiBuckets]int64 // which 10 s bucket each slot counts; 0 none
	seen    int64            // last tick that saw it in force
}

type uiResult int

const (
	uiAllowed uiResult = iota
	uiDenied
	uiShadowDenied
	uiDegraded
	uiResults
)

// count adds one decision; u may be nil (no page counters).
func (u *uiPolicy) count(r uiResult) {
	if u != nil {
		u.n[r].Add(1)
	}
}

// deny records a denied key in the sketch; u may be nil.
func (u *uiPolicy) deny(key string) {
	if u == nil {
		return
	}
	h := u.hh.Load()
	if h == nil {
		h = newHeavyHitters()
		if !u.hh.CompareAndSwap(nil, h) {
			h = u.hh.Load()
		}
	}
	// Why a coarse clock: the sketch's spans are 15 s and 3 min long, so
	// the sampler's reading (at most a second old) places a denial as
	// well as the clock would, for an atomic load instead of a clock read.
	now := u.stats.clock.Load()
	if now == 0 { // no sampler running: read the clock
		now = monotime.Now()
	}
	h.add(now, key)
}

// uiStats is the state behind /ui: the policies' samples, store outages,
// the last reload, and store latency snapshots.
type uiStats struct {
	clock    atomic.Int64 // monotime.Now at the sampler's last tick; 0 while no sampler runs
	off      bool         // no counters (benchmarks)
	hideKeys bool         // show keys as keyed hashes
	hashKey  []byte       // per-process secret for hashed keys
	started  time.Time

	mu       sync.Mutex
	policies map[string]*uiPolicy // by identity; pruned to those in force at each tick
	ticks    int64
	lastTick time.Time

	outages []uiOutage // the last uiOutages, oldest first
	reload  uiReload

	latBounds []float64
	lat       [uiLatencyRing][]uint64 // cumulative bucket counts (+Inf last)
	latAt     [uiLatencyRing]time.Time

	cacheMu  sync.Mutex
	cache    *UISnapshot
	cacheAt  time.Time
	cacheGen int64
	gen      atomic.Int64 // bumped by events the page must show at once (reloads, outages)
}

type uiOutage struct {
	start, end time.Time // end zero: still down
	err        string
}

type uiReload struct {
	at     time.Time
	ok     bool
	err    string
	files  []string
	paths  []string
	rules  int
	okN    int64
	failN  int64
	loaded time.Time // when the rules in force were loaded
}

// register returns the uiPolicy for identity id, making it with f if new.
func (u *uiStats) register(id string, f func() *uiPolicy) *uiPolicy {
	if u.off {
		return nil
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if p := u.policies[id]; p != nil {
		return p
	}
	p := f()
	p.seen, p.stats = u.ticks, u
	if u.policies == nil {
		u.policies = map[string]*uiPolicy{}
	}
	u.policies[id] = p
	return p
}

func fmtRate(p store.Policy) string {
	return strconv.FormatFloat(p.Rate, 'g', 6, 64) + "/s"
}

// uiFlag is the page entry of a policy from the flags (-rate/-burst, -limits).
func (s *Server) uiFlag(kind string, p store.Policy) *uiPolicy {
	id := kind + "\x00" + p.Name + "\x00" + fmtRate(p) + "\x00" + strconv.FormatInt(p.Burst, 10)
	return s.ui.register(id, func() *uiPolicy {
		return &uiPolicy{kind: kind, name: p.Name, rate: p.Rate, burst: p.Burst, per: fmtRate(p), limited: true}
	})
}

// uiRule is the page entry of a rule (or a limit override). A rule that a
// reload keeps with the same limit keeps its history.
func (s *Server) uiRule(r *rules.Rule, p store.Policy, limited bool) *uiPolicy {
	var path strings.Builder
	for i, l := range r.Path {
		if i > 0 {
			path.WriteString(" › ")
		}
		path.WriteString(l.Key)
		if l.Value != "" {
			path.WriteString("=" + l.Value)
		}
	}
	kind, where, per := "rule", r.File+":"+strconv.Itoa(r.Line), ""
	if r.Override {
		kind, where = "override", "Envoy limit override"
	}
	switch {
	case r.Unlimited:
		per = "unlimited"
	default:
		per = strconv.FormatUint(uint64(r.RequestsPerUnit), 10) + "/"
		if r.UnitMultiplier > 1 {
			per += strconv.FormatUint(uint64(r.UnitMultiplier), 10) + " "
		}
		per += string(r.Unit)
	}
	if r.Shadow {
		per += " (shadow)"
	}
	id := kind + "\x00" + r.Domain + "\x00" + path.String() + "\x00" + r.Name + "\x00" + per
	return s.ui.register(id, func() *uiPolicy {
		return &uiPolicy{kind: kind, name: r.Name, domain: r.Domain, path: path.String(), where: where,
			rate: p.Rate, burst: p.Burst, per: per, limited: limited}
	})
}

// inForce calls f for every policy entry of the server now: the default,
// -limits, the rules in force and the limit overrides with buckets.
func (s *Server) inForce(f func(*policyEntry)) {
	f(&s.def)
	for _, e := range s.byKey {
		f(e)
	}
	if rs := s.rules.Load(); rs != nil {
		for i := range rs.entries {
			f(&rs.entries[i].policyEntry)
		}
	}
	s.overrides.entries.Range(func(_, v any) bool {
		f(&v.(*ruleEntry).policyEntry)
		return true
	})
}

// UITick samples the page's counters: the rates now and the history of
// the last 15 minutes. `sluice serve` calls it every second (RunUI); the
// page calls it too, so a Server whose owner runs no sampler still shows
// what happened between page loads. Safe for concurrent use.
func (s *Server) UITick(now time.Time) {
	u := &s.ui
	if u.off {
		return
	}
	var live []*uiPolicy
	s.inForce(func(e *policyEntry) {
		if e.ui != nil {
			live = append(live, e.ui)
		}
	})
	bounds, lat := s.latencyNow()
	u.mu.Lock()
	defer u.mu.Unlock()
	dt := now.Sub(u.lastTick)
	if !u.lastTick.IsZero() && dt < 200*time.Millisecond {
		return // sampled a moment ago (the sampler and a page load)
	}
	first := u.lastTick.IsZero()
	u.lastTick = now
	u.ticks++
	bucket := now.UnixNano()/int64(uiBucket) + 1 // +1: 0 means unused
	for _, p := range live {
		if p.seen == u.ticks {
			continue // shared by several entries
		}
		p.seen = u.ticks
		slot := bucket % uiBuckets
		if p.epoch[slot] != bucket {
			p.epoch[slot], p.hist[slot] = bucket, [uiResults]uint32{}
		}
		for r := range uiResults {
			cur := p.n[r].Load()
			d := cur - p.last[r]
			p.last[r] = cur
			if first || dt <= 0 {
				p.rateNow[r] = 0
				continue
			}
			p.rateNow[r] = float64(d) / dt.Seconds()
			p.hist[slot][r] += uint32(min(d, 1<<31))
		}
	}
	// Forget the policies a reload dropped (their entries are gone).
	for id, p := range u.policies {
		// seen one tick back too: a policy registered while this tick
		// listed those in force is in force from the next.
		if p.seen < u.ticks-1 {
			delete(u.policies, id)
		}
	}
	if lat != nil {
		i := u.ticks % uiLatencyRing
		u.latBounds = bounds
		u.lat[i], u.latAt[i] = lat, now
	}
}

// RunUI samples the page's counters every second (UITick) until ctx ends.
func (s *Server) RunUI(ctx context.Context) {
	s.uiSampler.Store(true)
	defer func() {
		s.uiSampler.Store(false)
		s.ui.clock.Store(0)
	}()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	s.ui.clock.Store(monotime.Now())
	s.UITick(time.Now())
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.ui.clock.Store(monotime.Now())
			s.UITick(now)
		}
	}
}

// uiOutage records an edge of a store outage as the decisions see them
// (the gate calls it): its start with the store's error, its end with nil.
func (s *Server) uiOutage(err error) {
	if err == nil {
		s.uiOutageEnd()
		return
	}
	s.uiOutageStart(err)
}

// uiOutageStart and uiOutageEnd record the start and the end of an outage.
func (s *Server) uiOutageStart(err error) {
	u := &s.ui
	defer u.gen.Add(1)
	u.mu.Lock()
	defer u.mu.Unlock()
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	if len(u.outages) == uiOutages {
		u.outages = append(u.outages[:0], u.outages[1:]...)
	}
	u.outages = append(u.outages, uiOutage{start: time.Now(), err: msg})
}

func (s *Server) uiOutageEnd() {
	u := &s.ui
	defer u.gen.Add(1)
	u.mu.Lock()
	defer u.mu.Unlock()
	if n := len(u.outages); n > 0 && u.outages[n-1].end.IsZero() {
		u.outages[n-1].end = time.Now()
	}
}

// uiReloaded records a reload of the rules at paths: c loaded, or err.
func (s *Server) uiReloaded(paths []string, c *rules.Config, err error) {
	u := &s.ui
	defer u.gen.Add(1)
	u.mu.Lock()
	defer u.mu.Unlock()
	now := time.Now()
	u.reload.at, u.reload.paths = now, paths
	if err != nil {
		u.reload.ok, u.reload.err = false, err.Error()
		u.reload.failN++
		return
	}
	u.reload.ok, u.reload.err = true, ""
	u.reload.okN++
	u.reload.files, u.reload.rules, u.reload.loaded = c.Files, len(c.Rules), now
}

// latencyNow reads the store latency histogram: its bucket bounds and
// cumulative counts, the total last; nil if it cannot be read.
func (s *Server) latencyNow() (bounds []float64, counts []uint64) {
	m, ok := s.storeLat.(prometheus.Metric)
	if !ok {
		return nil, nil
	}
	var d dto.Metric
	if m.Write(&d) != nil || d.Histogram == nil {
		return nil, nil
	}
	for _, b := range d.Histogram.Bucket {
		bounds = append(bounds, b.GetUpperBound())
		counts = append(counts, b.GetCumulativeCount())
	}
	return bounds, append(counts, d.Histogram.GetSampleCount())
}

// uiLatencyStart records the store latency histogram as New leaves it, as
// the ring's tick 0: the baseline of the page's latency until a minute of
// samples has replaced it. Why not the first sample: the sampler starts
// after the listener, and the page's own samples come at its loads, so
// decisions made before either would be left out.
func (s *Server) uiLatencyStart() {
	u := &s.ui
	if u.off {
		return
	}
	bounds, lat := s.latencyNow()
	u.mu.Lock()
	defer u.mu.Unlock()
	if lat != nil {
		u.latBounds = bounds
		u.lat[0], u.latAt[0] = lat, u.started
	}
}

// latencyQuantiles returns the store latency quantiles qs over the last
// minute: the histogram now (cur, from latencyNow) less the oldest sample
// of the ring (at most a minute old; the one taken at start when younger),
// interpolated within the buckets as PromQL's histogram_quantile does. nil
// without observations. Called with u.mu held.
func (u *uiStats) latencyQuantiles(cur []uint64, now time.Time, qs ...float64) (out []float64, window time.Duration, n uint64) {
	if cur == nil || u.latBounds == nil {
		return nil, 0, 0
	}
	var prev []uint64
	since := u.started
	for back := int64(uiLatencyRing - 1); back >= 0; back-- {
		if u.ticks-back < 0 {
			continue // tick 0 is the start's (uiLatencyStart)
		}
		if i := (u.ticks - back) % uiLatencyRing; u.lat[i] != nil {
			prev, since = u.lat[i], u.latAt[i]
			break
		}
	}
	window = now.Sub(since)
	diff := make([]uint64, len(cur))
	for i := range cur {
		diff[i] = cur[i]
		if i < len(prev) {
			diff[i] -= prev[i]
		}
	}
	total := diff[len(diff)-1]
	if total == 0 {
		return nil, window, 0
	}
	for _, q := range qs {
		rank := q * float64(total)
		v := u.latBounds[len(u.latBounds)-1]
		for i, b := range u.latBounds {
			if float64(diff[i]) >= rank {
				lo, below := 0.0, uint64(0)
				if i > 0 {
					lo, below = u.latBounds[i-1], diff[i-1]
				}
				in := diff[i] - below
				if in > 0 {
					v = lo + (b-lo)*(rank-float64(below))/float64(in)
				} else {
					v = b
				}
				break
			}
		}
		out = append(out, v)
	}
	return out, window, total
}

// uiOff turns the page's counters off in every Server made while it is
// set: for the benchmark that measures what they cost (export_test.go).
var uiOff bool
