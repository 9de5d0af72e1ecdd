package service

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-go/sluice/internal/monotime"
	"github.com/sluice-go/sluice/store"
)

// The page at /ui: what an operator reads during an incident. One HTML
// file embedded in the binary (its CSS and a few lines of JavaScript
// inline; nothing is fetched from elsewhere), rendered on the server, so
// it shows every figure with JavaScript off; with JavaScript on it fetches
// its own main part again every second (/ui?part=main) and swaps it in,
// so the figures a browser shows are always the ones the server rendered.
// /ui/data has the same snapshot as JSON. Read-only: GET and HEAD only.

//go:embed ui/page.html
var uiFS embed.FS

var uiPage = template.Must(template.New("page.html").Funcs(template.FuncMap{
	"num":   uiNum,
	"dur":   uiDur,
	"secs":  func(f float64) string { return uiDur(time.Duration(f * 1e9)) },
	"minus": func(a, b uint64) uint64 { return a - b },
}).ParseFS(uiFS, "ui/page.html"))

// UIHistoryBuckets is the length of a policy's history in the snapshot
// (10 s buckets: 15 minutes).
const UIHistoryBuckets = uiBuckets

// uiTop is how many keys each top list shows.
const uiTop = 10

// UISnapshot is what /ui shows and /ui/data returns.
type UISnapshot struct {
	Now       time.Time    `json:"now"`
	Uptime    float64      `json:"uptime_seconds"`
	KeysShown bool         `json:"keys_shown"` // false: keys are keyed hashes (-ui-keys=false)
	Sampler   bool         `json:"sampler"`    // the 1 s sampler runs (RunUI); else history is sampled at page loads
	Policies  []UIPolicy   `json:"policies"`
	Store     UIStore      `json:"store"`
	Config    UIConfig     `json:"config"`
	Sketch    UISketchInfo `json:"sketch"`
}

// UISketchInfo states the heavy-hitters sketch's size and error bound.
type UISketchInfo struct {
	Counters int    `json:"counters"`
	Bound    string `json:"bound"`
}

// UIPolicy is one policy on the page.
type UIPolicy struct {
	Kind   string  `json:"kind"` // default, limit, rule, override
	Name   string  `json:"name"`
	Domain string  `json:"domain,omitempty"`
	Path   string  `json:"path,omitempty"`
	Where  string  `json:"where,omitempty"` // file:line of a rule
	Limit  string  `json:"limit"`           // "10/s", "100/minute", "unlimited"
	Rate   float64 `json:"rate"`
	Burst  int64   `json:"burst"`

	AllowedPerSec      float64 `json:"allowed_per_second"`
	DeniedPerSec       float64 `json:"denied_per_second"`
	ShadowDeniedPerSec float64 `json:"shadow_denied_per_second"`
	DegradedPerSec     float64 `json:"store_error_per_second"`
	AllowedTotal       uint64  `json:"allowed_total"`
	DeniedTotal        uint64  `json:"denied_total"`
	ShadowDeniedTotal  uint64  `json:"shadow_denied_total"`
	DegradedTotal      uint64  `json:"store_error_total"`

	// History: per 10 s bucket, oldest first, [allowed, denied (with
	// shadow-denied)] per second.
	History [][2]float64 `json:"history"`

	TopMinute   []HeavyKey `json:"top_denied_minute"`
	TopMinuteN  uint64     `json:"denied_minute"`
	TopQuarter  []HeavyKey `json:"top_denied_15m"`
	TopQuarterN uint64     `json:"denied_15m"`

	Chart uiChart `json:"-"`
}

// UIStore is the store's state on the page.
type UIStore struct {
	Kind    string     `json:"kind"`
	Healthy bool       `json:"healthy"`
	Health  string     `json:"health"` // "ok" or the ping's error
	Breaker string     `json:"breaker"`
	Fail    string     `json:"fail"` // open or closed
	Outages []UIOutage `json:"outages"`
	Latency *UILatency `json:"latency,omitempty"`
	Tables  []UITable  `json:"tables,omitempty"`
}

// UIOutage is one store outage as decisions saw it.
type UIOutage struct {
	Start   time.Time `json:"start"`
	End     time.Time `json:"end,omitzero"`
	Seconds float64   `json:"seconds"`
	Ongoing bool      `json:"ongoing"`
	Error   string    `json:"error"`
}

// UILatency are store latency quantiles, in seconds.
type UILatency struct {
	Window float64 `json:"window_seconds"`
	Count  uint64  `json:"count"`
	P50    float64 `json:"p50"`
	P90    float64 `json:"p90"`
	P99    float64 `json:"p99"`
	P999   float64 `json:"p999"`
}

// UITable is one shm table's slots (per policy; policies with the same
// rate and burst share a table).
type UITable struct {
	Policy    string `json:"policy"`
	Slots     int    `json:"slots"`
	Used      int    `json:"used"`
	Locked    int    `json:"locked"`
	Recovered uint64 `json:"recovered"`
	Evicted   uint64 `json:"evicted"`
	Contended uint64 `json:"contended"`
	Corrupt   uint64 `json:"corrupt"`
}

// UIConfig is the rules configuration on the page.
type UIConfig struct {
	Paths     []string  `json:"paths,omitempty"`
	Files     []string  `json:"files"`
	Rules     int       `json:"rules"`
	Loaded    time.Time `json:"loaded,omitzero"`
	Reloaded  time.Time `json:"last_reload,omitzero"`
	ReloadOK  bool      `json:"last_reload_ok"`
	Error     string    `json:"last_reload_error,omitempty"`
	ReloadsOK int64     `json:"reloads_ok"`
	Failed    int64     `json:"reloads_failed"`
	Limits    int       `json:"limits"` // -limits entries
}

// SlotUser is implemented by stores whose tables have a fixed number of
// slots (the shm store): for policy p, the slots holding a bucket that is
// not full now, and the table's slot count.
type SlotUser interface {
	SlotUsage(p store.Policy) (used, slots int)
}

func (s *Server) initUI() {
	u := &s.ui
	u.started = time.Now()
	u.hideKeys = s.cfg.UIHideKeys
	if u.hideKeys {
		u.hashKey = make([]byte, 32)
		_, _ = rand.Read(u.hashKey)
	}
	if s.cfg.Rules != nil {
		u.reload.files, u.reload.rules, u.reload.loaded = s.cfg.Rules.Files, len(s.cfg.Rules.Rules), u.started
	}
}

// uiKey is how the page shows a key: as it is, or with -ui-keys=false as a
// keyed hash (HMAC-SHA-256 under a secret drawn at start, so a hash cannot
// be reversed by trying every IP address; the same key shows the same hash
// for the life of the process).
func (u *uiStats) uiKey(k string) string {
	if !u.hideKeys {
		return k
	}
	m := hmac.New(sha256.New, u.hashKey)
	m.Write([]byte(k))
	return "#" + hex.EncodeToString(m.Sum(nil)[:8])
}

// UISnapshot returns what the page shows now. At most one snapshot is
// built per half second (unless a reload or an outage
// happened since), whatever the number of viewers (a snapshot pings
// the store and walks shm tables).
func (s *Server) UISnapshot(ctx context.Context) *UISnapshot {
	u := &s.ui
	u.cacheMu.Lock()
	defer u.cacheMu.Unlock()
	now, gen := time.Now(), u.gen.Load()
	if u.cache != nil && now.Sub(u.cacheAt) < 500*time.Millisecond && gen == u.cacheGen {
		return u.cache
	}
	s.UITick(now)
	snap := s.buildSnapshot(ctx, now)
	u.cache, u.cacheAt, u.cacheGen = snap, now, gen
	return snap
}

func (s *Server) buildSnapshot(ctx context.Context, now time.Time) *UISnapshot {
	u := &s.ui
	snap := &UISnapshot{Now: now, Uptime: now.Sub(u.started).Seconds(), KeysShown: !u.hideKeys,
		Sketch: UISketchInfo{Counters: HeavyCounters, Bound: fmt.Sprintf("Space-Saving, %d counters per span: a count is at most N/%d above the true one (N: the denials in the window); keys denied more than N/%d times are always listed", HeavyCounters, HeavyCounters, HeavyCounters)}}
	var entries []*policyEntry
	seen := map[*uiPolicy]bool{}
	s.inForce(func(e *policyEntry) {
		if e.ui != nil && !seen[e.ui] {
			seen[e.ui] = true
			entries = append(entries, e)
		}
	})
	mono := monotime.Now()
	cur := now.UnixNano()/int64(uiBucket) + 1
	_, latNow := s.latencyNow()
	u.mu.Lock()
	snap.Sampler = s.uiSampler.Load()
	for _, e := range entries {
		p := e.ui
		up := UIPolicy{Kind: p.kind, Name: p.name, Domain: p.domain, Path: p.path, Where: p.where, Limit: p.per,
			Rate: p.rate, Burst: p.burst,
			AllowedPerSec: p.rateNow[uiAllowed], DeniedPerSec: p.rateNow[uiDenied],
			ShadowDeniedPerSec: p.rateNow[uiShadowDenied], DegradedPerSec: p.rateNow[uiDegraded],
			AllowedTotal: p.n[uiAllowed].Load(), DeniedTotal: p.n[uiDenied].Load(),
			ShadowDeniedTotal: p.n[uiShadowDenied].Load(), DegradedTotal: p.n[uiDegraded].Load(),
			History: make([][2]float64, uiBuckets)}
		for i := range uiBuckets {
			b := cur - uiBuckets + 1 + int64(i)
			slot := b % uiBuckets
			if p.epoch[slot] == b {
				h := p.hist[slot]
				up.History[i] = [2]float64{float64(h[uiAllowed]) / 10, float64(h[uiDenied]+h[uiShadowDenied]) / 10}
			}
		}
		snap.Policies = append(snap.Policies, up)
	}
	for _, o := range u.outages {
		uo := UIOutage{Start: o.start, End: o.end, Error: o.err, Ongoing: o.end.IsZero()}
		end := o.end
		if uo.Ongoing {
			end = now
		}
		uo.Seconds = end.Sub(o.start).Seconds()
		snap.Store.Outages = append(snap.Store.Outages, uo)
	}
	slices.Reverse(snap.Store.Outages) // newest first
	if q, w, n := u.latencyQuantiles(latNow, now, 0.5, 0.9, 0.99, 0.999); q != nil {
		snap.Store.Latency = &UILatency{Window: w.Seconds(), Count: n, P50: q[0], P90: q[1], P99: q[2], P999: q[3]}
	}
	r := u.reload
	snap.Config = UIConfig{Paths: r.paths, Files: r.files, Rules: r.rules, Loaded: r.loaded, Reloaded: r.at,
		ReloadOK: r.ok, Error: r.err, ReloadsOK: r.okN, Failed: r.failN, Limits: len(s.byKey)}
	u.mu.Unlock()

	// The sketches (their own locks) and the store, outside u.mu.
	for i, e := range entries {
		if h := e.ui.hh.Load(); h != nil {
			p := &snap.Policies[i]
			p.TopMinute, p.TopMinuteN, p.TopQuarter, p.TopQuarterN = h.top(mono, uiTop)
			for j := range p.TopMinute {
				p.TopMinute[j].Key = u.uiKey(p.TopMinute[j].Key)
			}
			for j := range p.TopQuarter {
				p.TopQuarter[j].Key = u.uiKey(p.TopQuarter[j].Key)
			}
		}
		snap.Policies[i].Chart = newUIChart(snap.Policies[i].History)
	}
	st := &snap.Store
	st.Kind = s.cfg.Store.Name()
	st.Fail = "closed"
	if s.failOpen() {
		st.Fail = "open"
	}
	st.Breaker = "none (an in-process store cannot fail that way)"
	if b, ok := s.cfg.Store.(interface{ Fault() error }); ok {
		if err := b.Fault(); err != nil {
			st.Breaker = "open: " + err.Error()
		} else {
			st.Breaker = "closed"
		}
	}
	pctx, cancel := context.WithTimeout(ctx, min(s.cfg.StoreTimeout, time.Second))
	err := s.cfg.Store.Ping(pctx)
	cancel()
	st.Healthy, st.Health = err == nil, "ok"
	if err != nil {
		st.Health = err.Error()
	}
	st.Tables = s.uiTables(entries)
	return snap
}

// uiTables are the slots of the store's tables for the limited policies
// in force, when the store reports them (shm).
func (s *Server) uiTables(entries []*policyEntry) []UITable {
	ev, okEv := s.cfg.Store.(EvictionReporter)
	sl, okSl := s.cfg.Store.(SlotReporter)
	su, okSu := s.cfg.Store.(SlotUser)
	if !okEv && !okSl && !okSu {
		return nil
	}
	var out []UITable
	done := map[string]bool{}
	for _, e := range entries {
		if !e.ui.limited || e.p.Rate <= 0 || done[e.p.Name] {
			continue
		}
		done[e.p.Name] = true
		t := UITable{Policy: e.p.Name}
		if okSu {
			t.Used, t.Slots = su.SlotUsage(e.p)
		}
		if okSl {
			t.Locked, t.Recovered, t.Corrupt = sl.SlotHealth(e.p)
		}
		if okEv {
			t.Evicted, t.Contended = ev.Evictions(e.p)
		}
		out = append(out, t)
	}
	return out
}

// uiChart is a policy's 15 minutes as SVG paths (allowed, denied) in a
// 270×48 box, scaled to the busiest bucket.
type uiChart struct {
	Allowed, Denied string
	Max             string
}

func newUIChart(h [][2]float64) uiChart {
	const w, hgt = 270.0, 48.0
	top := 0.0
	for _, v := range h {
		top = max(top, v[0], v[1])
	}
	if top == 0 {
		return uiChart{Max: "0"}
	}
	path := func(k int) string {
		var b strings.Builder
		step := w / float64(len(h)-1)
		for i, v := range h {
			if i == 0 {
				b.WriteString("M")
			} else {
				b.WriteString(" L")
			}
			fmt.Fprintf(&b, "%.1f %.1f", float64(i)*step, hgt-v[k]/top*(hgt-2))
		}
		return b.String()
	}
	return uiChart{Allowed: path(0) + fmt.Sprintf(" L%.1f %.1f L0 %.1f Z", w, hgt, hgt), Denied: path(1), Max: uiNum(top)}
}

// uiNum formats a figure for the page: whole numbers plainly, small ones
// with up to three significant digits.
func uiNum(v any) string {
	switch x := v.(type) {
	case float64:
		switch {
		case x == 0:
			return "0"
		case math.Abs(x) >= 100:
			return strconv.FormatFloat(math.Round(x), 'f', 0, 64)
		default:
			return strconv.FormatFloat(x, 'g', 3, 64)
		}
	case uint64:
		return strconv.FormatUint(x, 10)
	case int:
		return strconv.Itoa(x)
	case int64:
		return strconv.FormatInt(x, 10)
	}
	return fmt.Sprint(v)
}

func uiDur(d time.Duration) string {
	switch {
	case d < time.Microsecond:
		return strconv.FormatInt(int64(d), 10) + " ns"
	case d < time.Millisecond:
		return strconv.FormatFloat(float64(d)/1e3, 'g', 3, 64) + " µs"
	case d < time.Second:
		return strconv.FormatFloat(float64(d)/1e6, 'g', 3, 64) + " ms"
	}
	return d.Round(100 * time.Millisecond).String()
}

// handleUI serves /ui (the page, or with ?part=main only its main part,
// which the page's script swaps in every second) and /ui/data (JSON).
func (s *Server) handleUI(w http.ResponseWriter, r *http.Request) {
	if !s.getOnly(w, r) {
		return
	}
	if s.ui.off {
		s.fail(w, http.StatusNotFound, "the page is off in this server")
		return
	}
	snap := s.UISnapshot(r.Context())
	if r.URL.Path == "/ui/data" {
		writeJSON(w, http.StatusOK, snap)
		return
	}
	if r.URL.Path == "/ui/" {
		// Relative, so that it holds behind a proxy that adds a prefix;
		// the page's own links are relative to /ui.
		// (http.Redirect would make it absolute.)
		w.Header().Set("Location", "../ui")
		w.WriteHeader(http.StatusMovedPermanently)
		return
	}
	if r.URL.Path != "/ui" {
		s.fail(w, http.StatusNotFound, "no such page %q: try /ui or /ui/data", r.URL.Path)
		return
	}
	name := "page"
	if r.URL.Query().Get("part") == "main" {
		name = "main"
	}
	var buf bytes.Buffer
	if err := uiPage.ExecuteTemplate(&buf, name, snap); err != nil {
		s.fail(w, http.StatusInternalServerError, "rendering the page: %v", err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	// Nothing on the page comes from elsewhere, so say so: a browser then
	// refuses anything injected, and no key shown can run as script.
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(buf.Bytes())
}
