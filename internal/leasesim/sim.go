// Package leasesim runs replicas deciding under capacity leases (package
// lease, with the allocator of internal/leasealloc) in virtual time
// (sched.Virtual) and measures what issue #39 asks of them: the bound
// burst + rate·(e − s) over every window, the capacity used while demand
// is at or above it, how fast shares follow a shift in demand, and the
// renewals per second. Each replica is a lease.Client with one Bucket under
// a ratelimiter.Shared limiter, whose caller takes one token per request
// with Acquire; the server is an Allocator behind an in-memory transport
// with a round-trip time, which faults can cut or restart. A run is a
// function of its Config and seed; an hour of virtual time takes seconds.
package leasesim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/sluice-go/sluice/internal/leasealloc"
	"github.com/sluice-go/sluice/lease"
	"github.com/sluice-go/sluice/ratelimiter"
	"github.com/sluice-go/sluice/sched"
)

// Config is one simulation.
type Config struct {
	Replicas int
	Rate     float64 // the policy's rate (Doorman's capacity), tokens a second
	Burst    int64   // the policy's burst
	Lease    time.Duration
	Refresh  time.Duration
	Length   time.Duration
	RTT      time.Duration // each renewal's round trip
	// MaxWait is how long a request waits in Acquire before it is dropped.
	MaxWait time.Duration
	// Measured leaves the demand to the replicas' own measure (admitted
	// since the last renewal, and whether callers waited) instead of
	// declaring it with Bucket.Want.
	Measured bool
	// Batch, when nonzero, sends each replica's requests in batches at
	// the same instants (every Batch from the start) instead of evenly
	// spaced: buckets fill between batches and every replica drains its
	// own at once, the worst case for the bound.
	Batch time.Duration
	// Demand: each replica starts wanting DemandStart tokens a second and,
	// every DemandEvery, moves by up to DemandStep of it, up or down, at
	// random (Doorman's simulation: 15, 10%, 10 s).
	DemandStart, DemandStep float64
	DemandEvery             time.Duration
	// Mishaps, one every MishapEvery (0: none), drawn with these weights
	// (Doorman's: 5 spike, 10 master election, 15 master lost for up to
	// 60 s; we add a replica's death and a replica cut off): a replica's
	// demand jumps by Spike; the server restarts (learning mode); the
	// server is unreachable for up to Outage; a replica dies and comes back
	// within Outage as a new process; one replica cannot reach the server
	// for up to Outage (the others can).
	MishapEvery                                   time.Duration
	SpikeW, RestartW, OutageW, DeathW, PartitionW int
	Spike                                         float64
	Outage                                        time.Duration
	// ServerDrift is how much faster the server's clock runs than the
	// replicas' (0.004 is 0.4%; negative: slower); ClientDrift is the
	// replicas' margin (lease.Options.Drift; 0 is its default, negative
	// none).
	ServerDrift, ClientDrift float64
	Algorithm                leasealloc.Algorithm
	Seed                     uint64
	// Shift, when nonzero, replaces the random demand by a step: every
	// replica starts at ShiftFrom(i) and moves to ShiftTo(i) at Shift; a
	// replica with ShiftFrom < 0 joins only at Shift.
	Shift              time.Duration
	ShiftFrom, ShiftTo func(i int) float64
	// Trace records every replica's demand and share in each Sample.
	Trace bool
}

// Doorman is Doorman's published scenario (its simulation's scenario
// seven): 45 clients sharing a capacity of 500, each wanting 15 at first
// and changing by up to 10% every 10 s, a mishap every minute, for an hour.
// Doorman's master election is our server restart, its lost master our
// unreachable server; a replica's death and a replica cut off are added. Leases last 60 s (the
// design doc's default), renewed every 5 s (its README's).
func Doorman(seed uint64) Config {
	return Config{
		Replicas: 45, Rate: 500, Burst: 500, Lease: 60 * time.Second, Refresh: 5 * time.Second,
		Length: time.Hour, RTT: 2 * time.Millisecond, MaxWait: 50 * time.Millisecond,
		DemandStart: 15, DemandStep: 0.1, DemandEvery: 10 * time.Second,
		MishapEvery: time.Minute, SpikeW: 5, RestartW: 10, OutageW: 15, DeathW: 5, PartitionW: 5,
		Spike: 100, Outage: 60 * time.Second,
		ServerDrift: 0.004, Seed: seed,
	}
}

// Thousand is the same with 1,000 replicas sharing 2,000 a second, each
// wanting 3 at first, for ten minutes.
func Thousand(seed uint64) Config {
	c := Doorman(seed)
	c.Replicas, c.Rate, c.Burst, c.DemandStart, c.Spike = 1000, 2000, 2000, 3, 20
	c.Length = 10 * time.Minute
	return c
}

// Sample is the state at one instant of a run.
type Sample struct {
	At       time.Duration // since the start
	Demand   float64       // total demand of the live replicas
	Shares   float64       // the rates the live replicas enforce
	Reserved float64       // what the server reserves (all leases)
	Admitted int64         // tokens admitted in the second before
	// Each is every replica's demand and share, in order, when
	// Config.Trace is set (a dead replica's are zero).
	Each []ReplicaSample
}

// ReplicaSample is one replica's state at one instant.
type ReplicaSample struct {
	Demand, Share float64
}

// Event is a mishap: when, which (spike, restart, outage, death,
// partition) and, for those of one replica, which one (else -1), and for
// how long (outages, deaths, partitions).
type Event struct {
	At, For time.Duration
	Kind    string
	Replica int
}

// Result is one run's record and figures.
type Result struct {
	Config                                        Config
	Samples                                       []Sample // one a second
	Admits                                        []time.Duration
	RPCs                                          int64
	Failures                                      int64 // renewals that failed (outages)
	Deaths, Outages, Restarts, Spikes, Partitions int
	Events                                        []Event

	// Excess is the largest admitted − (burst + rate·(e − s)) over every
	// window [s, e], in tokens: ≤ 0 means the bound held.
	Excess float64
	// Utilization is the mean of Shares / Rate over the samples where the
	// total demand was at or above the rate (leaving out the first lease
	// length, while the replicas start); Used is the same of admitted
	// tokens, Handed the same of the server's reservations (Doorman's
	// "capacity handed out").
	// Samples counts the samples these means are over.
	Utilization, Used, Handed float64
	Counted                   int
	// PeakShares is the largest Shares / Rate (Doorman's "over capacity").
	PeakShares float64
	// Follow is, in a Shift run, how long after the shift every replica's
	// share first came within 1% of the policy's rate of its max-min fair
	// share of the new demands (-1: never).
	Follow time.Duration
}

// replica is one process: a client, its bucket and its caller.
type replica struct {
	id     int
	demand float64
	alive  bool
	cut    bool // cannot reach the server
	client *lease.Client
	bucket *lease.Bucket
	stop   context.CancelFunc
	gen    int
}

type sim struct {
	cfg      Config
	rng      *rand.Rand
	start    time.Time
	alloc    *leasealloc.Allocator
	allocCfg leasealloc.Config
	down     bool
	rs       []*replica
	res      *Result
	follow   []float64 // in a Shift run: the fair shares after the shift
}

// record wraps a Bucket to note the instant of every token it admits.
type record struct {
	*lease.Bucket
	s   *sim
	now func() time.Time
}

func (r record) AllowN(n int64) bool {
	if !r.Bucket.AllowN(n) {
		return false
	}
	at := r.now().Sub(r.s.start)
	for range n {
		r.s.res.Admits = append(r.s.res.Admits, at)
	}
	return true
}

// Run runs cfg under sched.Virtual.
func Run(cfg Config) (*Result, error) {
	s := &sim{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 39)), res: &Result{Config: cfg, Follow: -1}}
	s.allocCfg = leasealloc.Config{
		Policies: map[string]leasealloc.Policy{"p": {Rate: cfg.Rate, Burst: cfg.Burst}},
		Lease:    cfg.Lease, Refresh: cfg.Refresh, Algorithm: cfg.Algorithm, MaxHolders: 4 * cfg.Replicas,
	}
	start := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	err := sched.Run(context.Background(), func(ctx context.Context) error {
		s.start = sched.Now(ctx)
		c := s.allocCfg
		c.NoLearning = true // the first start: nothing can be in force
		var err error
		if s.alloc, err = leasealloc.New(c, s.serverNow(ctx)); err != nil {
			return err
		}
		ctx, cancel := sched.WithDeadline(ctx, s.start.Add(cfg.Length))
		defer cancel()
		if cfg.Shift > 0 {
			s.shiftTargets()
		}
		for i := range cfg.Replicas {
			r := &replica{id: i}
			s.rs = append(s.rs, r)
			d := s.drawDemand()
			if cfg.Shift > 0 {
				d = cfg.ShiftFrom(i)
			}
			if d >= 0 {
				r.demand = d
				// spread the replicas' first renewals over one interval
				at := time.Duration(s.rng.Int64N(int64(cfg.Refresh)))
				sched.Go(ctx, func(ctx context.Context) error {
					if err := sched.Sleep(ctx, at); err != nil {
						return nil
					}
					return s.startReplica(ctx, r)
				})
			}
		}
		sched.Go(ctx, s.sampler)
		if cfg.Shift > 0 {
			sched.Go(ctx, s.shifter)
		} else {
			sched.Go(ctx, s.demands)
			sched.Go(ctx, s.mishaps)
		}
		_ = sched.Sleep(ctx, cfg.Length) // until the deadline ends every fiber
		return nil
	}, sched.Virtual(start), sched.WithSeed(cfg.Seed))
	if err != nil {
		return nil, err
	}
	s.figures()
	return s.res, nil
}

// serverNow is the server's clock: it runs ServerDrift faster.
func (s *sim) serverNow(ctx context.Context) time.Time {
	now := sched.Now(ctx)
	el := now.Sub(s.start)
	return now.Add(time.Duration(float64(el) * s.cfg.ServerDrift))
}

func (s *sim) drawDemand() float64 { return s.cfg.DemandStart }

func (s *sim) transport(r *replica) lease.Transport {
	return lease.TransportFunc(func(ctx context.Context, req *lease.Request) (*lease.Response, error) {
		s.res.RPCs++
		if err := sched.Sleep(ctx, s.cfg.RTT/2); err != nil {
			return nil, err
		}
		if s.down || r.cut {
			s.res.Failures++
			return nil, errors.New("leasesim: server unreachable")
		}
		resp, err := s.alloc.RenewAt(s.serverNow(ctx), req)
		if err != nil {
			return nil, err
		}
		if err := sched.Sleep(ctx, s.cfg.RTT/2); err != nil {
			return nil, err
		}
		return resp, nil
	})
}

// startReplica starts r as a new process: a client, its bucket, its
// renewals and its caller, until r dies or the run ends.
func (s *sim) startReplica(ctx context.Context, r *replica) error {
	ctx, cancel := context.WithCancel(ctx)
	r.gen++
	c, err := lease.NewClient(ctx, s.transport(r), lease.Options{
		Holder: fmt.Sprintf("r%d.%d", r.id, r.gen), Refresh: s.cfg.Refresh, Drift: s.cfg.ClientDrift})
	if err != nil {
		cancel()
		return err
	}
	b, err := c.Bucket(ctx, "p", "k")
	for err != nil { // the server is away: try again later
		if serr := sched.Sleep(ctx, s.cfg.Refresh); serr != nil {
			cancel()
			return nil
		}
		b, err = c.Bucket(ctx, "p", "k")
	}
	if !s.cfg.Measured {
		b.Want(r.demand)
	}
	r.client, r.bucket, r.stop, r.alive = c, b, cancel, true
	now := func() time.Time { return sched.Now(ctx) }
	lim, err := ratelimiter.New(ctx, max(b.Rate(), 1), int(b.Burst()), ratelimiter.Shared(record{b, s, now}))
	if err != nil {
		cancel()
		return err
	}
	sched.Daemon(ctx, c.Run)
	sched.Go(ctx, func(ctx context.Context) error {
		defer lim.Stop()
		s.caller(ctx, r, lim)
		return nil
	})
	return nil
}

// caller sends requests at r's demand, evenly spaced; each waits at most
// MaxWait in Acquire, else it is dropped.
func (s *sim) caller(ctx context.Context, r *replica, lim *ratelimiter.Limiter) {
	if s.cfg.Batch > 0 {
		s.batches(ctx, r, lim)
		return
	}
	next := sched.Now(ctx)
	for ctx.Err() == nil {
		if r.demand <= 0 {
			if sched.Sleep(ctx, 100*time.Millisecond) != nil {
				return
			}
			next = sched.Now(ctx)
			continue
		}
		next = next.Add(time.Duration(float64(time.Second) / r.demand))
		if now := sched.Now(ctx); next.Before(now) {
			next = now // requests missed while waiting are dropped
		}
		if sched.Sleep(ctx, next.Sub(sched.Now(ctx))) != nil {
			return
		}
		if lim.TryAcquire(1) {
			continue // the common case, without a timer for the wait
		}
		wctx, cancel := sched.WithTimeout(ctx, s.cfg.MaxWait)
		_ = lim.Acquire(wctx, 1)
		cancel()
	}
}

// batches sends r's requests of each Batch at its start, one after another.
func (s *sim) batches(ctx context.Context, r *replica, lim *ratelimiter.Limiter) {
	for {
		el := sched.Now(ctx).Sub(s.start)
		next := (el/s.cfg.Batch + 1) * s.cfg.Batch
		if sched.Sleep(ctx, next-el) != nil {
			return
		}
		n := int(r.demand*s.cfg.Batch.Seconds() + 0.5)
		for range n {
			if ctx.Err() != nil {
				return
			}
			if lim.TryAcquire(1) {
				continue
			}
			wctx, cancel := sched.WithTimeout(ctx, s.cfg.MaxWait)
			_ = lim.Acquire(wctx, 1)
			cancel()
		}
	}
}

// demands moves each replica's demand at random every DemandEvery.
func (s *sim) demands(ctx context.Context) error {
	for sched.Sleep(ctx, s.cfg.DemandEvery) == nil {
		for _, r := range s.rs {
			s.setDemand(r, max(r.demand*(1+s.cfg.DemandStep*(1-2*s.rng.Float64())), 0))
		}
	}
	return nil
}

func (s *sim) setDemand(r *replica, d float64) {
	r.demand = d
	if r.alive && !s.cfg.Measured {
		r.bucket.Want(d)
	}
}

// mishaps causes one mishap every MishapEvery.
func (s *sim) mishaps(ctx context.Context) error {
	if s.cfg.MishapEvery <= 0 {
		return nil
	}
	total := s.cfg.SpikeW + s.cfg.RestartW + s.cfg.OutageW + s.cfg.DeathW + s.cfg.PartitionW
	for sched.Sleep(ctx, s.cfg.MishapEvery) == nil {
		m := s.rng.IntN(total)
		r := s.rs[s.rng.IntN(len(s.rs))]
		out := time.Duration(s.rng.Int64N(int64(s.cfg.Outage)) + 1)
		ev := func(kind string, r *replica, d time.Duration) {
			e := Event{At: sched.Now(ctx).Sub(s.start), For: d, Kind: kind, Replica: -1}
			if r != nil {
				e.Replica = r.id
			}
			s.res.Events = append(s.res.Events, e)
		}
		switch {
		case m < s.cfg.SpikeW:
			s.res.Spikes++
			ev("spike", r, 0)
			s.setDemand(r, r.demand+s.cfg.Spike)
		case m < s.cfg.SpikeW+s.cfg.RestartW:
			s.res.Restarts++
			ev("restart", nil, 0)
			a, err := leasealloc.New(s.allocCfg, s.serverNow(ctx)) // learning mode
			if err != nil {
				return err
			}
			s.alloc = a
		case m < s.cfg.SpikeW+s.cfg.RestartW+s.cfg.OutageW:
			if s.down {
				continue
			}
			s.res.Outages++
			ev("outage", nil, out)
			s.down = true
			sched.Go(ctx, func(ctx context.Context) error {
				_ = sched.Sleep(ctx, out)
				s.down = false
				return nil
			})
		case m >= total-s.cfg.PartitionW:
			if r.cut {
				continue
			}
			s.res.Partitions++
			ev("partition", r, out)
			r.cut = true
			sched.Go(ctx, func(ctx context.Context) error {
				_ = sched.Sleep(ctx, out)
				r.cut = false
				return nil
			})
		default:
			if !r.alive {
				continue
			}
			s.res.Deaths++
			ev("death", r, out)
			r.alive = false
			r.stop() // no release: a dead process says nothing
			sched.Go(ctx, func(ctx context.Context) error {
				if sched.Sleep(ctx, out) != nil {
					return nil
				}
				return s.startReplica(ctx, r)
			})
		}
	}
	return nil
}

// sampler records a Sample every second.
func (s *sim) sampler(ctx context.Context) error {
	lastAdmits := 0
	for {
		if sched.Sleep(ctx, time.Second) != nil {
			return nil
		}
		now := sched.Now(ctx)
		sm := Sample{At: now.Sub(s.start), Admitted: int64(len(s.res.Admits) - lastAdmits)}
		lastAdmits = len(s.res.Admits)
		if s.cfg.Trace {
			sm.Each = make([]ReplicaSample, len(s.rs))
		}
		for i, r := range s.rs {
			if r.alive {
				sm.Demand += r.demand
				rate, _, _ := r.bucket.Share()
				sm.Shares += rate
				if sm.Each != nil {
					sm.Each[i] = ReplicaSample{Demand: r.demand, Share: rate}
				}
			}
		}
		sm.Reserved, _ = s.alloc.ReservedAt(s.serverNow(ctx), "p", "k")
		s.res.Samples = append(s.res.Samples, sm)
	}
}

// shiftTargets computes the max-min fair shares of the demands after the
// shift.
func (s *sim) shiftTargets() {
	n := s.cfg.Replicas
	ds := make([]float64, n)
	for i := range n {
		ds[i] = s.cfg.ShiftTo(i)
	}
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	level, rem := math.Inf(1), s.cfg.Rate
	for i, d := range sorted {
		if left := float64(n - i); d > rem/left {
			level = rem / left
			break
		}
		rem -= d
	}
	s.follow = make([]float64, n)
	for i, d := range ds {
		s.follow[i] = min(d, level)
	}
}

// shifter applies the shift and measures how long the shares take to
// follow it.
func (s *sim) shifter(ctx context.Context) error {
	if sched.Sleep(ctx, s.cfg.Shift) != nil {
		return nil
	}
	for i, r := range s.rs {
		r.demand = s.cfg.ShiftTo(i)
		if r.alive && !s.cfg.Measured {
			r.bucket.Want(r.demand)
		} else {
			sched.Go(ctx, func(ctx context.Context) error { return s.startReplica(ctx, r) })
		}
	}
	tol := 0.01 * s.cfg.Rate
	for {
		ok := true
		for i, r := range s.rs {
			if !r.alive {
				ok = false
				break
			}
			if rate, _, _ := r.bucket.Share(); math.Abs(rate-s.follow[i]) > tol {
				ok = false
				break
			}
		}
		if ok {
			s.res.Follow = sched.Now(ctx).Sub(s.start) - s.cfg.Shift
			return nil
		}
		if sched.Sleep(ctx, 10*time.Millisecond) != nil {
			return nil
		}
	}
}

// figures computes the Result's figures from its record.
func (s *sim) figures() {
	res := s.res
	res.Excess = Excess(res.Admits, s.cfg.Rate, s.cfg.Burst)
	var n int
	var util, used, handed float64
	for i, sm := range res.Samples {
		res.PeakShares = max(res.PeakShares, sm.Shares/s.cfg.Rate)
		// a sample counts when the demand was at or above the rate at both
		// ends of its second
		// (after the first lease length, while the replicas start)
		if sm.At >= s.cfg.Lease && sm.Demand >= s.cfg.Rate && i > 0 && res.Samples[i-1].Demand >= s.cfg.Rate {
			n++
			util += sm.Shares / s.cfg.Rate
			used += float64(sm.Admitted) / s.cfg.Rate
			handed += sm.Reserved / s.cfg.Rate
		}
	}
	res.Counted = n
	if n > 0 {
		res.Utilization, res.Used, res.Handed = util/float64(n), used/float64(n), handed/float64(n)
	}
}

// Excess returns the largest count(admits in [s, e]) − (burst + rate·(e −
// s)) over every window, in tokens, exactly for admits sorted ascending:
// the worst windows start and end at admits, so it is the largest
// f(j) − f(i) + 1 − burst over i ≤ j, with f(k) = k − rate·t_k, in one pass.
// The arithmetic is in 10⁻¹² tokens with rate in thousandths of a token a
// second, exact for runs of up to an hour at 2,000 tokens a second.
func Excess(admits []time.Duration, rate float64, burst int64) float64 {
	if len(admits) == 0 {
		return -float64(burst)
	}
	rm := int64(math.Round(rate * 1000))
	const p = 1_000_000_000_000
	best := int64(math.MinInt64)
	minF := int64(math.MaxInt64)
	for k, t := range admits {
		f := int64(k)*p - rm*int64(t) // 10⁻¹² tokens
		minF = min(minF, f)
		best = max(best, f-minF+p)
	}
	return float64(best-burst*p) / p
}
