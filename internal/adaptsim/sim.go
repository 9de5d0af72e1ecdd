// Package adaptsim runs clients against a simulated upstream
// (httplimittest) in virtual time and measures how much of the upstream's
// quota each one uses and how many 429s it draws: httplimit.Adaptive side
// by side with a fixed rate, retries alone, and plain AIMD. Fifteen virtual
// minutes take well under a second; a run is a function of its Scenario,
// Mode, callers and seed.
package adaptsim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/sluice-go/sluice/httplimit"
	"github.com/sluice-go/sluice/httplimit/httplimittest"
	"github.com/sluice-go/sluice/ratelimiter"
	"github.com/sluice-go/sluice/sched"
)

// Quota is the upstream's nominal rate, requests a second, in every
// scenario; its bucket holds one second of it.
const Quota = 100

// Duration is how long each run lasts, in virtual time.
const Duration = 15 * time.Minute

// Settle is the time after each change of the quota that utilization
// leaves out: the time a client is given to find the new rate.
const Settle = 60 * time.Second

// Scenario is an upstream quota over time and the client's first guess.
type Scenario struct {
	Name    string
	Initial float64         // the client's starting rate
	Changes []time.Duration // when the quota changes (0 is always one)
	Quota   func(seed uint64) httplimittest.Quota
	Restore time.Duration // when a lowered quota comes back, or a quota rises (0: none)
	Length  time.Duration // the run's length (0: Duration)
}

// Scenarios returns the scenarios of docs/adaptive.md.
func Scenarios() []Scenario {
	fixed := func(q httplimittest.Quota) func(uint64) httplimittest.Quota {
		return func(uint64) httplimittest.Quota { return q }
	}
	return []Scenario{
		{Name: "unknown, start 10× low", Initial: Quota / 10, Quota: fixed(httplimittest.Steps(Quota))},
		{Name: "unknown, start 10× high", Initial: Quota * 10, Quota: fixed(httplimittest.Steps(Quota))},
		Drop(300*time.Second, 60*time.Second),
		{
			Name: "2× rise", Initial: Quota, Changes: []time.Duration{300 * time.Second}, Restore: 300 * time.Second,
			Quota: fixed(httplimittest.Steps(Quota, httplimittest.Step{At: 300 * time.Second, Rate: 2 * Quota})),
		},
		neighbour(),
	}
}

// Drop returns the scenario of a quota halved at at for length, the
// client starting at the quota.
func Drop(at, length time.Duration) Scenario {
	return Scenario{
		Name: fmt.Sprintf("50%% drop for %g s", length.Seconds()), Initial: Quota,
		Changes: []time.Duration{at, at + length}, Restore: at + length,
		Quota: func(uint64) httplimittest.Quota {
			return httplimittest.Steps(Quota,
				httplimittest.Step{At: at, Rate: Quota / 2},
				httplimittest.Step{At: at + length, Rate: Quota})
		},
	}
}

// neighbour: another client of the same quota takes a share that changes
// every 90 s to a share drawn from the seed in [0, 60%].
func neighbour() Scenario {
	const every = 90 * time.Second
	var changes []time.Duration
	for at := every; at < Duration; at += every {
		changes = append(changes, at)
	}
	return Scenario{
		Name: "noisy neighbour", Initial: Quota, Changes: changes,
		Quota: func(seed uint64) httplimittest.Quota {
			r := rand.New(rand.NewPCG(seed, 0x6e656967))
			steps := make([]httplimittest.Step, len(changes))
			for i, at := range changes {
				steps[i] = httplimittest.Step{At: at, Rate: Quota * (1 - 0.6*r.Float64())}
			}
			return httplimittest.Steps(Quota, steps...)
		},
	}
}

// Mode is the client under test.
type Mode string

const (
	// Adaptive is httplimit.Transport with httplimit.Adaptive(1, 10000).
	Adaptive Mode = "adaptive"
	// Fixed is httplimit.Transport at the initial rate: holds, no adapting.
	Fixed Mode = "fixed rate"
	// Retries is each caller at the initial rate, retrying every 429 after
	// its own Retry-After (up to 3 times), with no shared hold.
	Retries Mode = "retries alone"
	// AIMD is httplimit.Transport whose rate rises by 2 requests a second
	// each second and halves on a throttle (one halving per hold).
	AIMD Mode = "plain AIMD"
)

// Modes lists every Mode, Adaptive first.
var Modes = []Mode{Adaptive, Fixed, Retries, AIMD}

// Result is one run's record and figures.
type Result struct {
	Scenario string
	Mode     Mode
	Callers  int
	Res      time.Duration // slot width of the series
	Quota    []float64     // quota available to us, per slot (requests a second)
	Served   []int64       // 200s per slot
	Refused  []int64       // 429s per slot
	Rate     []float64     // the client limiter's rate at each slot's start

	Utilization float64       // served ÷ quota, leaving out Settle after each change
	Refusals    int64         // 429s in the whole run
	FirstMinute int64         // 429s in the first Settle
	Reach90     time.Duration // first time a 1 s window served ≥ 90% of the quota (-1: never)
	Recovery    time.Duration // from Restore to the end of a 1 s window at ≥ 90% (-1: never or no Restore)
}

// Run runs one scenario with one mode and n callers, each sending the next
// request as soon as its previous one is answered, for Duration of virtual
// time under sched.Virtual with seed.
func Run(sc Scenario, mode Mode, callers int, seed uint64) (*Result, error) {
	rn := newRun(sc, seed)
	err := sched.Run(context.Background(), func(ctx context.Context) error {
		start := sched.Now(ctx)
		rt, lim, err := rn.client(ctx, mode, start)
		if err != nil {
			return err
		}
		defer lim.Stop()
		sched.Daemon(ctx, func(ctx context.Context) error { // samples the rate
			for i := range rn.rates {
				rn.rates[i] = lim.Rate()
				if err := sched.Sleep(ctx, res); err != nil {
					return nil
				}
			}
			return nil
		})
		fibers := make([]*sched.Fiber, callers)
		for i := range fibers {
			fibers[i] = sched.Go(ctx, func(ctx context.Context) error {
				ctx, cancel := sched.WithDeadline(ctx, start.Add(rn.length))
				defer cancel()
				return caller(ctx, rt)
			})
		}
		for _, f := range fibers {
			if err := f.Wait(ctx); err != nil {
				return err
			}
		}
		return nil
	}, sched.Virtual(time.Time{}), sched.WithSeed(seed))
	if err != nil {
		return nil, err
	}
	return rn.result(mode, callers), nil
}

// RunGoroutines is Run with plain goroutines for callers and an upstream
// latency (each way half of it), so that requests overlap in flight. It
// must be called inside a testing/synctest bubble (synctest.Test), whose
// fake clock makes the minutes cost no real time; the bubble orders
// goroutines as the runtime does, so runs with latency are not replayed
// slot for slot by a seed.
func RunGoroutines(sc Scenario, mode Mode, callers int, latency time.Duration, seed uint64) (*Result, error) {
	rn := newRun(sc, seed)
	rn.latency = latency
	start := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(rn.length))
	defer cancel()
	rt, lim, err := rn.client(ctx, mode, start)
	if err != nil {
		return nil, err
	}
	defer lim.Stop()
	var wg sync.WaitGroup
	wg.Go(func() { // samples the rate
		for i := range rn.rates {
			rn.rates[i] = lim.Rate()
			time.Sleep(res)
		}
	})
	errs := make([]error, callers)
	for i := range callers {
		wg.Go(func() { errs[i] = caller(ctx, rt) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return rn.result(mode, callers), nil
}

// res is the width of a Result's slots.
const res = 100 * time.Millisecond

// run is one run's setting and record.
type run struct {
	sc      Scenario
	quota   httplimittest.Quota
	length  time.Duration
	latency time.Duration
	up      *httplimittest.Upstream
	rates   []float64
}

func newRun(sc Scenario, seed uint64) *run {
	rn := &run{sc: sc, quota: sc.Quota(seed), length: sc.Length}
	if rn.length == 0 {
		rn.length = Duration
	}
	rn.rates = make([]float64, int(rn.length/res))
	return rn
}

// client makes the upstream, starting at start, and mode's client of it.
func (rn *run) client(ctx context.Context, mode Mode, start time.Time) (http.RoundTripper, *ratelimiter.Limiter, error) {
	opts := []httplimittest.Option{httplimittest.Burst(Quota), httplimittest.Resolution(res), httplimittest.StartAt(start)}
	if rn.latency > 0 {
		opts = append(opts, httplimittest.Latency(rn.latency))
	}
	up := httplimittest.New(rn.quota, opts...)
	rn.up = up
	lim, err := ratelimiter.New(ctx, rn.sc.Initial, 5)
	if err != nil {
		return nil, nil, err
	}
	switch mode {
	case Adaptive:
		return httplimit.Transport(up, lim, httplimit.Adaptive(1, 10000), httplimit.AdaptiveLog(nil)), lim, nil
	case Fixed:
		return httplimit.Transport(up, lim), lim, nil
	case Retries:
		return &retrier{base: up, lim: lim, max: 3}, lim, nil
	case AIMD:
		return httplimit.Transport(&observer{base: up, law: &aimd{lim: lim, rate: rn.sc.Initial}}, lim), lim, nil
	}
	lim.Stop()
	return nil, nil, fmt.Errorf("adaptsim: unknown mode %q", mode)
}

// caller sends one request after another through rt until ctx ends.
func caller(ctx context.Context, rt http.RoundTripper) error {
	for ctx.Err() == nil {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://upstream.test/", nil)
		if err != nil {
			return err
		}
		resp, err := rt.RoundTrip(req)
		if err != nil {
			// The run's end: a wait that would pass it fails at once,
			// matching DeadlineExceeded.
			if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
				return nil
			}
			return err
		}
		resp.Body.Close()
	}
	return nil
}

func (rn *run) result(mode Mode, callers int) *Result {
	slots := len(rn.rates)
	r := &Result{Scenario: rn.sc.Name, Mode: mode, Callers: callers, Res: res, Rate: rn.rates}
	r.Served, r.Refused = pad(rn.up.Served(), slots), pad(rn.up.Refused(), slots)
	r.Quota = make([]float64, slots)
	for i := range r.Quota {
		r.Quota[i] = rn.quota(time.Duration(i) * res)
	}
	r.measure(rn.sc)
	return r
}

func pad(s []int64, n int) []int64 {
	out := make([]int64, n)
	copy(out, s)
	return out
}

func (r *Result) measure(sc Scenario) {
	changes := append([]time.Duration{0}, sc.Changes...)
	per := r.Res.Seconds()
	var served, avail float64
	for i := range r.Served {
		at := time.Duration(i) * r.Res
		r.Refusals += r.Refused[i]
		if at < Settle {
			r.FirstMinute += r.Refused[i]
		}
		settling := false
		for _, c := range changes {
			if at >= c && at < c+Settle {
				settling = true
			}
		}
		if !settling {
			served += float64(r.Served[i])
			avail += r.Quota[i] * per
		}
	}
	r.Utilization = math.NaN()
	if avail > 0 {
		r.Utilization = served / avail
	}
	r.Reach90 = r.reach(0)
	r.Recovery = -1
	if sc.Restore > 0 {
		if d := r.reach(sc.Restore); d >= 0 {
			r.Recovery = d - sc.Restore
		}
	}
}

// reach returns the end of the first 1 s window starting at or after from
// in which the served requests were ≥ 90% of the quota, or -1.
func (r *Result) reach(from time.Duration) time.Duration {
	w := int(time.Second / r.Res)
	first := int(from / r.Res)
	var sum int64
	var q float64
	for i := first; i < len(r.Served); i++ {
		sum += r.Served[i]
		q += r.Quota[i] * r.Res.Seconds()
		if i-first >= w {
			sum -= r.Served[i-w]
			q -= r.Quota[i-w] * r.Res.Seconds()
		}
		if i-first+1 >= w && float64(sum) >= 0.9*q {
			return time.Duration(i+1) * r.Res
		}
	}
	return -1
}

// retrier is "retries alone": each request waits its turn on the limiter
// and, answered 429, waits out its own Retry-After and tries again.
type retrier struct {
	base http.RoundTripper
	lim  *ratelimiter.Limiter
	max  int
}

func (t *retrier) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	for attempt := 0; ; attempt++ {
		if err := t.lim.Acquire(ctx, 1); err != nil {
			return nil, err
		}
		resp, err := t.base.RoundTrip(req)
		if err != nil || resp.StatusCode != http.StatusTooManyRequests || attempt == t.max {
			return resp, err
		}
		secs, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
		resp.Body.Close()
		if err := sched.Sleep(ctx, time.Duration(secs)*time.Second); err != nil {
			return nil, err
		}
	}
}

// observer feeds each answer to a law, for a law that is not built into
// the Transport (plain AIMD).
type observer struct {
	base http.RoundTripper
	law  *aimd
}

func (o *observer) RoundTrip(req *http.Request) (*http.Response, error) {
	sent := sched.Now(req.Context())
	resp, err := o.base.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	o.law.feed(sent, sched.Now(req.Context()), resp.StatusCode == http.StatusTooManyRequests)
	return resp, nil
}

// aimd is plain AIMD on the limiter's rate: +2 requests a second for each
// second of answers, halved on a throttle of a request sent after the last
// halving, within [1, 10000].
type aimd struct {
	lim  *ratelimiter.Limiter
	mu   sync.Mutex
	rate float64
	last time.Time
	cut  time.Time
}

func (a *aimd) feed(sent, now time.Time, throttled bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case throttled && sent.Before(a.cut):
	case throttled:
		a.rate, a.cut = max(1, a.rate/2), now
	case !a.last.IsZero():
		a.rate = min(10000, a.rate+2*now.Sub(a.last).Seconds())
	}
	a.last = now
	_ = a.lim.SetRate(a.rate)
}
