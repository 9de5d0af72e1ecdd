// Package leasealloc is the server side of capacity leases (package lease
// is the replica's): per (policy, key) a table of leases, each a share of
// the policy's rate and burst held by one replica until an expiry, and the
// allocation that decides each share from the demands the replicas report.
// It is pure logic: no I/O, no goroutines, time passed in by the caller
// (RenewAt(now, …)), so the service, the simulation and the tests drive the
// same code.
//
// # The invariant
//
// At every instant, for every key, the shares that may be in force at the
// replicas sum to at most the policy's rate and burst. A share may be in
// force from the moment the server sends it until its expiry, unless the
// holder has since acknowledged a later grant or given the lease back. So
// the allocator reserves, per lease, the larger of the share the holder last
// acknowledged (Request Seq, HaveRate, HaveBurst) and every share sent since
// that has not been acknowledged, each until its own expiry; it grants a
// holder at most what the policy leaves after every other lease's
// reservation. A shrink therefore frees capacity for others only once the
// holder acknowledges it (on its next renewal) or once the old share
// expires; a replica that lowers its own share (it wants less) acknowledges
// the smaller share in the same request, which frees the difference at once.
// Rates are kept in whole thousandths of a token a second (int64), so the
// sums are exact, not subject to float rounding.
//
// # Allocation
//
// FairShare (the default) is max-min fair by demand, Doorman's FAIR_SHARE:
// every holder gets its demand if it fits, and the holders that want more
// split what is left equally (water filling). Proportional gives each holder
// the policy's rate times its demand over the sum of demands, when demands
// exceed the rate. A holder reporting Waiting counts as wanting the whole
// rate. Capacity nobody wants is not handed out, so a replica whose demand
// rises, or a new one, finds it free at its next renewal. The burst is split
// in proportion to the rate (at least 1 for a nonzero rate, as far as the
// policy's burst is free).
//
// # Restarts: learning mode
//
// A restarted allocator does not know the leases its predecessor granted,
// which are in force for up to one lease length. Rather than keep the table
// in a store (Redis), it follows Doorman's learning mode: for one lease
// length after New it grants only capacity it has learned of. A holder
// renewing with a token and a share (Seq, HaveRate, HaveBurst) has its
// lease adopted, exactly as large; the adopted shares of a key form a pool,
// and until learning ends the key's grants come from that pool alone (so a
// learned holder that wants less frees capacity for another, and a new
// holder gets only what the pool has spare). Why that is safe: before the
// restart the shares in force summed to at most the policy; each adopted
// share is one of them, so the pool plus the shares of holders not yet
// heard from still sum to at most the policy, and the pool's grants never
// exceed the pool. When learning ends, every lease the predecessor granted
// and nobody renewed has expired.
// Why this and not the store: it needs no store round trip per renewal and
// no store at all (the memory and shm stores keep working), it cannot
// over-grant whatever the store's state, and its cost is bounded and stated
// (new holders, and growth, wait one lease length after a restart), while
// a shared table in Redis would add a store dependency, a consistency
// protocol among servers, and a failure mode of its own (the store down).
// Several servers behind one address would each need their own keys; that
// is the store's case, not this package's.
//
// An Allocator is safe for concurrent use; every method takes one lock.
package leasealloc

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sluice-go/sluice/lease"
)

// Algorithm is how an allocator splits a policy among holders.
type Algorithm int

const (
	// FairShare is max-min fair by demand (Doorman's FAIR_SHARE).
	FairShare Algorithm = iota
	// Proportional splits the rate in proportion to the demands.
	Proportional
)

func (a Algorithm) String() string {
	switch a {
	case FairShare:
		return "fair"
	case Proportional:
		return "proportional"
	}
	return "Algorithm(" + strconv.Itoa(int(a)) + ")"
}

// Policy is a capacity shared by the holders of each of its keys.
type Policy struct {
	Rate  float64 // tokens a second, > 0 and ≤ MaxRate
	Burst int64   // tokens, ≥ 1
}

// MaxRate is the largest policy rate, in tokens a second: rates are kept in
// thousandths of a token a second, and a sum over a million holders must
// not overflow.
const MaxRate = 1e9

// Limits and defaults of Config.
const (
	DefaultLease      = 20 * time.Second
	DefaultRefresh    = 5 * time.Second
	DefaultMaxKeys    = 1000
	DefaultMaxHolders = 10_000
	DefaultMaxLeases  = 1_000_000
	// MaxNameLen bounds holder, policy and key names, in bytes.
	MaxNameLen = 1024
)

// Config configures an Allocator; zero fields take the defaults.
type Config struct {
	Policies map[string]Policy
	// Lease is how long a grant is good for (default 20 s); Refresh is how
	// often holders renew (default 5 s, at most Lease/2).
	Lease, Refresh time.Duration
	Algorithm      Algorithm
	// MaxKeys bounds the keys of one request (default 1000), MaxHolders the
	// holders of one key (default 10,000), MaxLeases the leases of the
	// whole allocator (default 1,000,000; at most 1,000,000).
	MaxKeys, MaxHolders, MaxLeases int
	// NoLearning skips learning mode. Only for an allocator that knows no
	// lease of its policies can be in force: the first start ever, or a test.
	NoLearning bool
}

// Stats are an allocator's counts since New.
type Stats struct {
	Tables, Leases int  // now, swept as of the last call
	Learning       bool // as of the last call
	Requests       int64
	Grants         int64
	Released       int64
	// Refusals by condition, each key counted once.
	BadRequest, BadDemand, UnknownPolicy, TooManyKeys, TooManyHolders, NotHeld int64
}

// Allocator is the lease tables of a set of policies. Make one with New.
type Allocator struct {
	mu         sync.Mutex
	cfg        Config
	policies   map[string]mpolicy
	tables     map[tkey]*table
	leases     int
	learnUntil time.Time
	stats      Stats
	tokens     uint64 // source of token uniqueness, with the start time
	startNanos int64
}

type tkey struct{ policy, key string }

// mpolicy is a Policy in thousandths of a token a second.
type mpolicy struct {
	rate  int64
	burst int64
}

const milli = 1000

// New returns an allocator started at now: in learning mode until now +
// Lease unless cfg.NoLearning. Bad values (a policy rate not in (0,
// MaxRate], a burst < 1, Refresh above Lease/2, negative limits) are an
// error naming them.
func New(cfg Config, now time.Time) (*Allocator, error) {
	if cfg.Lease == 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.Refresh == 0 {
		cfg.Refresh = min(DefaultRefresh, cfg.Lease/2)
	}
	if cfg.MaxKeys == 0 {
		cfg.MaxKeys = DefaultMaxKeys
	}
	if cfg.MaxHolders == 0 {
		cfg.MaxHolders = DefaultMaxHolders
	}
	if cfg.MaxLeases == 0 {
		cfg.MaxLeases = DefaultMaxLeases
	}
	switch {
	case cfg.Lease < time.Millisecond:
		return nil, fmt.Errorf("leasealloc: lease length %v: want at least 1ms", cfg.Lease)
	case cfg.Refresh < time.Millisecond || cfg.Refresh > cfg.Lease/2:
		// Why Lease/2: a holder must get at least one more try at renewing
		// before its lease ends, or one lost request costs it the lease.
		return nil, fmt.Errorf("leasealloc: refresh %v: want between 1ms and half the lease (%v)", cfg.Refresh, cfg.Lease/2)
	case cfg.MaxKeys < 0 || cfg.MaxHolders < 0 || cfg.MaxLeases < 0 || cfg.MaxLeases > DefaultMaxLeases:
		return nil, fmt.Errorf("leasealloc: limits keys=%d holders=%d leases=%d: want ≥ 0 and leases ≤ %d",
			cfg.MaxKeys, cfg.MaxHolders, cfg.MaxLeases, DefaultMaxLeases)
	case cfg.Algorithm != FairShare && cfg.Algorithm != Proportional:
		return nil, fmt.Errorf("leasealloc: unknown algorithm %v", cfg.Algorithm)
	}
	a := &Allocator{cfg: cfg, policies: make(map[string]mpolicy, len(cfg.Policies)),
		tables: make(map[tkey]*table), startNanos: now.UnixNano()}
	for name, p := range cfg.Policies {
		if !(p.Rate > 0 && p.Rate <= MaxRate) || p.Burst < 1 {
			return nil, fmt.Errorf("leasealloc: policy %q: rate %v burst %d: want 0 < rate ≤ %g and burst ≥ 1", name, p.Rate, p.Burst, float64(MaxRate))
		}
		r := int64(p.Rate * milli)
		if r < 1 {
			return nil, fmt.Errorf("leasealloc: policy %q: rate %v is below a thousandth of a token a second", name, p.Rate)
		}
		a.policies[name] = mpolicy{rate: r, burst: p.Burst}
	}
	if !cfg.NoLearning {
		a.learnUntil = now.Add(cfg.Lease)
	}
	return a, nil
}

// Config returns the allocator's configuration, defaults filled in.
func (a *Allocator) Config() Config { return a.cfg }

// Learning reports whether the allocator is in learning mode at now.
func (a *Allocator) Learning(now time.Time) bool { return now.Before(a.learnUntil) }

// Stats returns the counts.
func (a *Allocator) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.stats
	s.Tables, s.Leases = len(a.tables), a.leases
	return s
}

// share is a grant's rate (thousandths) and burst, in force until until.
type share struct {
	rate  int64
	burst int64
	until time.Time
}

func (s share) at(now time.Time) (int64, int64) {
	if now.Before(s.until) {
		return s.rate, s.burst
	}
	return 0, 0
}

// union is the smallest share covering both, for as long as either lasts.
func union(x, y share) share {
	return share{max(x.rate, y.rate), max(x.burst, y.burst), laterOf(x.until, y.until)}
}

func laterOf(x, y time.Time) time.Time {
	if x.After(y) {
		return x
	}
	return y
}

// entry is one holder's lease on one key.
type entry struct {
	holder, token string
	seq           uint64 // the latest grant sent
	last          share  // that grant
	ackedSeq      uint64
	acked         share // what the holder said it enforces, under ackedSeq
	// unacked covers every grant sent since the holder last acknowledged
	// the latest one: each may have reached it, or may yet.
	unacked share
	want    int64 // demand in thousandths, Waiting as the policy's rate
	learned bool  // made in learning mode from the holder's report
}

func (e *entry) reserved(now time.Time) (int64, int64) {
	r1, b1 := e.acked.at(now)
	r2, b2 := e.unacked.at(now)
	return max(r1, r2), max(b1, b2)
}

func (e *entry) end() time.Time { return laterOf(e.acked.until, e.unacked.until) }

// table is the leases of one (policy, key), with the demands kept sorted
// for the fair share. Why a slice beside the map: every renewal walks all
// the table's leases once (to drop the expired and sum the reservations),
// and a slice walks several times faster than a map.
type table struct {
	p       mpolicy
	holders map[string]*entry
	list    []*entry
	wants   []int64 // every entry's want, ascending
	sum     uint64  // of wants
	// poolRate and poolBurst sum the shares adopted in learning mode: the
	// capacity a restarted allocator knows of, all it may grant from
	// until learning ends.
	poolRate, poolBurst int64
}

func (t *table) addWant(w int64) {
	i, _ := slices.BinarySearch(t.wants, w)
	t.wants = slices.Insert(t.wants, i, w)
	t.sum += uint64(w)
}

func (t *table) removeWant(w int64) {
	if i, ok := slices.BinarySearch(t.wants, w); ok {
		t.wants = slices.Delete(t.wants, i, i+1)
		t.sum -= uint64(w)
	}
}

func (t *table) add(e *entry) {
	t.holders[e.holder] = e
	t.list = append(t.list, e)
	t.addWant(e.want)
}

func (t *table) remove(e *entry) {
	delete(t.holders, e.holder)
	if i := slices.Index(t.list, e); i >= 0 {
		last := len(t.list) - 1
		t.list[i] = t.list[last]
		t.list[last] = nil
		t.list = t.list[:last]
	}
	t.removeWant(e.want)
}

// sweep drops the leases that ended by now, returning how many.
func (t *table) sweep(now time.Time) int {
	n := 0
	for i := 0; i < len(t.list); {
		if e := t.list[i]; !now.Before(e.end()) {
			t.remove(e) // moves the last entry to i
			n++
			continue
		}
		i++
	}
	return n
}

// reservedExcept sums the reservations of every lease but skip at now.
func (t *table) reservedExcept(now time.Time, skip *entry) (int64, int64) {
	var r, b int64
	for _, e := range t.list {
		if e != skip {
			er, eb := e.reserved(now)
			r += er
			b += eb
		}
	}
	return r, b
}

// target is the rate the algorithm gives a holder wanting w.
func (t *table) target(alg Algorithm, w int64) int64 {
	if alg == Proportional {
		if t.sum <= uint64(t.p.rate) {
			return w
		}
		// w·rate/sum, exactly, floored: the floors sum to at most rate.
		hi, lo := bits.Mul64(uint64(w), uint64(t.p.rate))
		q, _ := bits.Div64(hi, lo, t.sum)
		return int64(q)
	}
	// Water filling over the ascending wants: each fits whole while it is
	// at most an equal split of what is left; past that, the rest split.
	rem := t.p.rate
	n := int64(len(t.wants))
	for i, d := range t.wants {
		left := n - int64(i)
		if d > rem/left {
			return min(w, rem/left)
		}
		rem -= d
	}
	return w
}

// burstFor is the burst that goes with rate r: the policy's burst in
// proportion, at least 1 for a nonzero rate.
func (p mpolicy) burstFor(r int64) int64 {
	if r <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(p.burst), uint64(r))
	q, _ := bits.Div64(hi, lo, uint64(p.rate))
	return max(int64(q), 1)
}

// RenewAt handles one request at now. A request the allocator cannot take
// at all (too many keys, no holder) is an error (ErrTooManyKeys,
// ErrBadRequest); otherwise the response has one Grant per key, refused
// keys carrying their code in Grant.Error.
func (a *Allocator) RenewAt(now time.Time, req *lease.Request) (*lease.Response, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stats.Requests++
	a.stats.Learning = now.Before(a.learnUntil)
	switch {
	case len(req.Keys) > a.cfg.MaxKeys:
		a.stats.TooManyKeys++
		return nil, fmt.Errorf("%w: %d keys, at most %d", lease.ErrTooManyKeys, len(req.Keys), a.cfg.MaxKeys)
	case req.Holder == "" || len(req.Holder) > MaxNameLen:
		a.stats.BadRequest++
		return nil, fmt.Errorf("%w: holder %.40q: want 1 to %d bytes", lease.ErrBadRequest, req.Holder, MaxNameLen)
	}
	resp := &lease.Response{Keys: make([]lease.Grant, len(req.Keys)), RefreshMS: a.cfg.Refresh.Milliseconds()}
	seen := make(map[tkey]bool, len(req.Keys))
	for i := range req.Keys {
		kr := &req.Keys[i]
		g := &resp.Keys[i]
		g.Policy, g.Key = kr.Policy, kr.Key
		k := tkey{kr.Policy, kr.Key}
		var err error
		if seen[k] {
			err = fmt.Errorf("%w: policy %q key %q twice in one request", lease.ErrBadRequest, kr.Policy, kr.Key)
		} else {
			seen[k] = true
			err = a.renewKey(now, req.Holder, k, kr, g)
		}
		if err != nil {
			a.count(err)
			*g = lease.Grant{Policy: kr.Policy, Key: kr.Key, Error: lease.Code(err), Message: err.Error()}
		}
	}
	return resp, nil
}

func (a *Allocator) count(err error) {
	s := &a.stats
	switch {
	case errors.Is(err, lease.ErrBadRequest):
		s.BadRequest++
	case errors.Is(err, lease.ErrBadDemand):
		s.BadDemand++
	case errors.Is(err, lease.ErrUnknownPolicy):
		s.UnknownPolicy++
	case errors.Is(err, lease.ErrTooManyHolders):
		s.TooManyHolders++
	case errors.Is(err, lease.ErrNotHeld):
		s.NotHeld++
	}
}

// finite reports whether x is a number ≥ 0 a share can be.
func finite(x float64) bool { return x >= 0 && !math.IsInf(x, 1) }

// toMilli converts a checked rate to thousandths, capped at c.
func toMilli(x float64, c int64) int64 {
	if x*milli >= float64(c) {
		return c
	}
	return int64(x * milli)
}

// haveMilli converts a share a holder says it enforces to thousandths,
// capped at c, rounding up: an error may only over-reserve. Why the
// 1e-6: a share the server sent as k/1000 comes back as a float within
// 1e-12 of k/1000, which must read as k, not k+1.
func haveMilli(x float64, c int64) int64 {
	if x*milli >= float64(c) {
		return c
	}
	return int64(math.Ceil(x*milli - 1e-6))
}

func (a *Allocator) renewKey(now time.Time, holder string, k tkey, kr *lease.KeyRequest, g *lease.Grant) error {
	switch {
	case k.policy == "" || k.key == "" || len(k.policy) > MaxNameLen || len(k.key) > MaxNameLen:
		return fmt.Errorf("%w: policy %.40q key %.40q: want 1 to %d bytes each", lease.ErrBadRequest, k.policy, k.key, MaxNameLen)
	case !finite(kr.Want) || !finite(kr.HaveRate) || kr.HaveBurst < 0:
		return fmt.Errorf("%w: want %v have_rate %v have_burst %d: want finite numbers ≥ 0", lease.ErrBadDemand, kr.Want, kr.HaveRate, kr.HaveBurst)
	}
	p, ok := a.policies[k.policy]
	if !ok {
		return fmt.Errorf("%w: %q", lease.ErrUnknownPolicy, k.policy)
	}
	t := a.tables[k]
	if t != nil {
		a.leases -= t.sweep(now)
	}
	var e *entry
	if t != nil {
		e = t.holders[holder]
	}
	learning := now.Before(a.learnUntil)
	if e != nil && e.token != kr.Token {
		return fmt.Errorf("%w: holder %.40q of policy %q key %.40q: wrong token", lease.ErrNotHeld, holder, k.policy, k.key)
	}
	if kr.Release {
		if e == nil {
			return fmt.Errorf("%w: holder %.40q gives back policy %q key %.40q, which it does not hold", lease.ErrNotHeld, holder, k.policy, k.key)
		}
		// Why at once: the holder capped itself at zero before it sent this,
		// and it sends one request at a time, so no grant of this lease is
		// in force or on its way to it any more.
		t.remove(e)
		a.leases--
		a.dropIfEmpty(k, t)
		a.stats.Released++
		g.LimitRate, g.LimitBurst = float64(p.rate)/milli, p.burst
		return nil
	}
	want := toMilli(kr.Want, p.rate)
	if kr.Waiting {
		want = p.rate
	}
	if e == nil {
		if t != nil && len(t.holders) >= a.cfg.MaxHolders {
			return fmt.Errorf("%w: policy %q key %.40q has %d holders, at most %d", lease.ErrTooManyHolders, k.policy, k.key, len(t.holders), a.cfg.MaxHolders)
		}
		if a.leases >= a.cfg.MaxLeases {
			a.sweepAll(now)
			if a.leases >= a.cfg.MaxLeases {
				return fmt.Errorf("%w: the server holds %d leases, at most %d", lease.ErrTooManyHolders, a.leases, a.cfg.MaxLeases)
			}
		}
		if t == nil {
			t = &table{p: p, holders: make(map[string]*entry)}
			a.tables[k] = t
		}
		e = &entry{holder: holder}
		if learning && kr.Token != "" && kr.Seq != 0 {
			// Adopt the lease the holder says it has from our predecessor,
			// exactly as large, never beyond what the policy leaves.
			r, b := t.reservedExcept(now, nil)
			hr := min(haveMilli(kr.HaveRate, p.rate), p.rate-r)
			hb := min(kr.HaveBurst, p.burst-b)
			e.token, e.seq, e.ackedSeq, e.learned = kr.Token, kr.Seq, kr.Seq, true
			e.acked = share{max(hr, 0), max(hb, 0), now.Add(a.cfg.Lease)}
			e.last = e.acked
			t.poolRate += e.acked.rate
			t.poolBurst += e.acked.burst
		} else {
			e.token = a.newToken(now)
		}
		e.want = want
		t.add(e)
		a.leases++
	} else {
		e.ack(kr, p)
		t.removeWant(e.want)
		e.want = want
		t.addWant(want)
	}
	budgetRate, budgetBurst := p.rate, p.burst
	if learning {
		// Grant only from capacity learned of: what the adopted leases
		// held. The rest may be in force at holders that have not renewed
		// yet (see the package doc).
		budgetRate, budgetBurst = t.poolRate, t.poolBurst
	}
	or, ob := t.reservedExcept(now, e)
	rate := min(t.target(a.cfg.Algorithm, want), budgetRate-or)
	burst := min(p.burstFor(rate), budgetBurst-ob)
	if burst <= 0 || rate <= 0 {
		// A rate without a token of burst admits nothing: leave both to
		// holders that can use them.
		rate, burst = 0, 0
	}
	e.seq++
	e.last = share{rate, burst, now.Add(a.cfg.Lease)}
	e.unacked = union(e.unacked, e.last)
	a.stats.Grants++
	*g = lease.Grant{Policy: k.policy, Key: k.key, Token: e.token, Seq: e.seq,
		Rate: float64(rate) / milli, Burst: burst, ExpiresMS: a.cfg.Lease.Milliseconds(),
		LimitRate: float64(p.rate) / milli, LimitBurst: p.burst}
	return nil
}

// ack applies what the holder reports it enforces.
func (e *entry) ack(kr *lease.KeyRequest, p mpolicy) {
	hr, hb := haveMilli(kr.HaveRate, p.rate), kr.HaveBurst
	switch kr.Seq {
	case e.seq:
		// The latest grant reached the holder, which applies only grants
		// newer than its own: every earlier one is out of force, and no
		// later one exists. What it enforces is that grant, or less.
		e.ackedSeq = e.seq
		e.acked = share{min(hr, e.last.rate), min(hb, e.last.burst), e.last.until}
		e.unacked = share{}
	case e.ackedSeq:
		// The grants since were lost (or are still on their way): they stay
		// reserved; the acknowledged share may only shrink.
		e.acked = share{min(hr, e.acked.rate), min(hb, e.acked.burst), e.acked.until}
	}
	// Any other Seq names no grant we know: keep every reservation.
}

func (a *Allocator) dropIfEmpty(k tkey, t *table) {
	if len(t.holders) == 0 {
		delete(a.tables, k)
	}
}

// newToken returns a token no other lease of this allocator has had: the
// allocator's start and a counter. Why not random: tokens prove who holds a
// lease among cooperating replicas (a process that reuses another's holder
// name), they are not secrets against an attacker, and a counter is
// deterministic under a seeded simulation.
func (a *Allocator) newToken(now time.Time) string {
	a.tokens++
	return strconv.FormatInt(a.startNanos, 36) + "." + strconv.FormatUint(a.tokens, 36)
}

// SweepAt drops every lease that ended by now, and empty tables; the
// service calls it now and then so holders that vanished free their memory.
func (a *Allocator) SweepAt(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sweepAll(now)
}

func (a *Allocator) sweepAll(now time.Time) {
	for k, t := range a.tables {
		a.leases -= t.sweep(now)
		a.dropIfEmpty(k, t)
	}
}

// ReservedAt returns the sum of the reservations of (policy, key)'s leases
// at now (rate in tokens a second): what may be in force at the holders,
// which the invariant keeps within the policy.
func (a *Allocator) ReservedAt(now time.Time, policy, key string) (rate float64, burst int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.tables[tkey{policy, key}]
	if t == nil {
		return 0, 0
	}
	r, b := t.reservedExcept(now, nil)
	return float64(r) / milli, b
}

// Holder is one lease as a table lists it.
type Holder struct {
	Holder          string
	Want            float64   // tokens a second (the policy's rate when waiting)
	Rate            float64   // the latest grant's rate
	Burst           int64     // and burst
	ReservedRate    float64   // what stays reserved for it at the time asked
	ReservedBurst   int64     //
	End             time.Time // when its reservation ends unless renewed
	LearnedFromPeer bool      // adopted in learning mode
}

// HoldersAt lists the unexpired leases of (policy, key) at now, by holder.
func (a *Allocator) HoldersAt(now time.Time, policy, key string) []Holder {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := a.tables[tkey{policy, key}]
	if t == nil {
		return nil
	}
	var hs []Holder
	for _, e := range t.list {
		if !now.Before(e.end()) {
			continue
		}
		r, b := e.reserved(now)
		hs = append(hs, Holder{Holder: e.holder, Want: float64(e.want) / milli, Rate: float64(e.last.rate) / milli,
			Burst: e.last.burst, ReservedRate: float64(r) / milli, ReservedBurst: b, End: e.end(), LearnedFromPeer: e.learned})
	}
	slices.SortFunc(hs, func(x, y Holder) int { return cmp.Compare(x.Holder, y.Holder) })
	return hs
}
