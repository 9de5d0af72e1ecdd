package adapt

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"
)

// RateSetter is what a Law drives: a *ratelimiter.Limiter is one.
type RateSetter interface {
	Rate() float64
	SetRate(rate float64) error
}

// Law finds the rate an upstream accepts by itself and keeps a limiter's
// rate there. The caller reports each answer: OK for a request
// the upstream served, Throttled for one it refused for being too fast (an
// HTTP 429, a 503 with Retry-After, a RateLimit field with r=0). The Law
// sets the limiter's rate from what it learns, always within [min, max] and
// under any ceiling set with SetCeiling. httplimit.Adaptive wires one into
// an HTTP Transport.
//
// The control law:
//
//   - Start: the limiter's own rate is the first guess. While the callers
//     use the rate and nothing is throttled, it doubles every second, so a
//     guess 10× too low is corrected in a few seconds.
//   - Cut: a throttle sets the rate to 98% of what the upstream served
//     since the previous cut: the successes counted since, over the time
//     since. The upstream's bucket was empty at both throttles, so this is
//     a floor of its refill rate, and equals it when the callers kept it
//     busy. The first throttle, with nothing measured yet, halves the rate
//     and the next one measures. Throttles of requests sent before a cut
//     change nothing: the cut answered them.
//   - Plateau and probe: after a cut the rate stays put for a plateau,
//     then rises, gently at first and faster the longer no throttle comes,
//     to find room the upstream may have made. What a failed probe got
//     served beyond the upstream's burst (learned from an earlier probe or
//     the start) is again a floor of the quota, taken if higher. A probe
//     that finds the same ceiling makes the next plateau 4× longer, from 2
//     seconds up to 2 minutes: a steady upstream sees a throttle every 2
//     minutes or so.
//   - Fall: a cut below a level that held means the quota fell. For the
//     next 90 seconds the probe is a step straight back to that level every
//     2.5 seconds: it costs one throttle while the quota is still low, and
//     takes a returned quota within 5 seconds.
//
// The rate rises only while the callers use it (responses come at half the
// rate or more): an idle client does not climb to max and then flood the
// upstream when work arrives.
//
// A Law owns the limiter's rate: a rate set on the limiter by anyone
// else lasts only until the next report (OK, Throttled, SetCeiling), which
// sets the law's rate again. So the limiter stays within [min, max] whatever
// else writes to it; an advertised policy goes through SetCeiling, never
// to the limiter directly.
//
// A Law is safe for concurrent use; the zero value is not usable (use New). Its methods never block; the times
// they take are the caller's clock (sched.Now for fibers of a loop,
// time.Now otherwise), which keeps the law exact under virtual time.
type Law struct {
	lim      RateSetter
	min, max float64
	log      *slog.Logger
	factor   float64

	mu          sync.Mutex
	rate        float64 // the rate set on lim
	want        float64 // the law's rate; lim follows it in steps of adaptSetRateStep
	ceiling     float64 // +Inf when none
	phase       adaptPhase
	base        float64       // the plateau's rate
	plateau     time.Duration // how long the next plateau lasts
	phaseAt     time.Time     // when the plateau or probe began
	cutAt       time.Time     // the last cut; zero before the first
	served      float64       // OKs for requests sent since cutAt
	fallen      float64       // the plateau before a fall (0: none): probe back to it fast
	held        float64       // the last rate borne out (0: none)
	fallAt      time.Time     // when it fell
	fallPlateau time.Duration // the plateau before the fall
	last        time.Time     // the last update of rate and seen
	seen        float64       // answers a second, decayed over a second
	logged      float64       // the rate at the last log line
	firstAt     time.Time     // the first answer
	guess       bool          // base is an estimate not yet borne out: its throttle corrects it
	probedFrom  float64       // the base a probe left, while its estimate is checked
	probeServed float64       // OKs for requests sent since the probe began
	probeGot    float64       // probeServed and the probe's span at its failure
	probeSpan   float64
	burst       float64 // the upstream's burst as measured (-1: not yet)
	startServed float64 // OKs before the first throttle
	startSpan   float64 // seconds from the first answer to the first throttle
	cuts        int64
}

type adaptPhase uint8

const (
	phaseStart adaptPhase = iota
	phasePlateau
	phaseProbe
)

// The law's constants. Why these: the first plateau is short so a fresh
// estimate is checked soon; the longest keeps a steady upstream's throttles
// to one every couple of minutes, and is what a rise of the quota may wait
// for; a fall is remembered as long as a typical shed of load lasts, and
// probed for at a pace that takes its return within 5 s (hold + plateau +
// the second it takes to show).
const (
	adaptMargin        = 0.98 // cut to this share of the measured rate
	adaptFirstCut      = 0.5  // the first throttle's cut, with nothing measured
	adaptMinPlateau    = 2 * time.Second
	adaptFallPlateau   = 2500 * time.Millisecond // + the hold + a second: a return is taken within 5 s
	adaptFallConfirm   = 3 * time.Second
	adaptProbeG0       = 0.02
	adaptProbeG1       = 0.01
	adaptMaxPlateau    = 2 * time.Minute
	adaptFallMemory    = 90 * time.Second
	adaptPlateauGrowth = 4
	adaptLongSpan      = 10 * time.Second
	adaptUsed          = 0.5 // the rate rises only while answers come at this share of it or more
	adaptSetRateStep   = 0.005
)

// Option configures New.
type Option func(*Law)

// LogChanges makes a Law log, at level Info on l, each time its rate
// has moved by more than factor (> 1) from the rate it last logged: the
// first cut of a run, a fall of the quota, its return. A nil l is
// slog.Default().
func LogChanges(l *slog.Logger, factor float64) Option {
	return func(a *Law) {
		if l == nil {
			l = slog.Default()
		}
		a.log, a.factor = l, factor
	}
}

// ErrBadBounds is returned by New for bounds that leave no rate.
var ErrBadBounds = errors.New("adapt: bad bounds")

// New returns a Law driving lim's rate within [min, max]. It
// starts from lim's rate, brought into [min, max]. min must be > 0 and
// max ≥ min (max may be +Inf); a LogChanges factor must be > 1.
func New(lim RateSetter, min, max float64, opts ...Option) (*Law, error) {
	if lim == nil {
		panic("adapt: New with a nil limiter")
	}
	if !(min > 0) || math.IsInf(min, 1) || !(max >= min) {
		return nil, fmt.Errorf("%w: min %v, max %v: want 0 < min ≤ max", ErrBadBounds, min, max)
	}
	a := &Law{lim: lim, min: min, max: max, ceiling: math.Inf(1), plateau: adaptMinPlateau, burst: -1}
	for _, o := range opts {
		o(a)
	}
	if a.log != nil && !(a.factor > 1) {
		return nil, fmt.Errorf("%w: log factor %v: want > 1", ErrBadBounds, a.factor)
	}
	a.rate = a.clamp(lim.Rate())
	a.want, a.logged = a.rate, a.rate
	if a.rate != lim.Rate() {
		if err := lim.SetRate(a.rate); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// Rate returns the rate the Law has set: the limiter's, or, if someone
// else changed the limiter's since the last report, the one the next
// report sets again.
func (a *Law) Rate() float64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.rate
}

// Cuts returns how many times a throttle lowered the rate.
func (a *Law) Cuts() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cuts
}

// SetCeiling caps the rate at c, as an upstream's advertised policy does
// (httplimit reads RateLimit-Policy); the rate drops to c at once if it is
// above. A c ≤ 0 or +Inf removes the ceiling. The floor min still holds: a
// ceiling below min leaves the rate at min.
func (a *Law) SetCeiling(c float64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !(c > 0) {
		c = math.Inf(1)
	}
	a.ceiling = c
	if a.base > c {
		a.base = c
	}
	a.set(a.want, a.last)
	a.own()
}

// OK reports that a request sent at sent was served, at now.
func (a *Law) OK(sent, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.count(now)
	if !sent.Before(a.cutAt) {
		a.served++
	}
	if a.phase == phaseProbe && !sent.Before(a.phaseAt) {
		a.probeServed++
	}
	a.advance(now)
	a.own()
}

// Throttled reports that a request sent at sent was refused for being too
// fast, at now; hold is how long the upstream asked to wait (0 when it did
// not say). A throttle for a request sent before the last cut, or at its
// instant, changes nothing: the cut already answered it.
func (a *Law) Throttled(sent, now time.Time, hold time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	defer a.own()
	a.count(now)
	if !a.cutAt.IsZero() && !sent.After(a.cutAt) {
		return
	}
	a.advance(now)
	r := a.want
	// measured: what the upstream served since the last cut. Its bucket was
	// empty then and is empty now, so this is its refill rate, the quota,
	// when the callers kept it busy throughout, and less otherwise.
	measured := 0.0
	if span := now.Sub(a.cutAt).Seconds(); !a.cutAt.IsZero() && span > 0 {
		measured = a.served / span
	}
	next := r
	switch {
	case a.phase == phaseStart:
		// Nothing measured yet: halve, and let the next throttle (if the
		// half is still too fast) measure.
		next = adaptFirstCut * r
		a.startServed, a.startSpan = a.served, now.Sub(a.firstAt).Seconds()
		a.guess = true
	case a.phase == phasePlateau || a.guess:
		// The base was refused: a guess too high, or the quota fell.
		next = adaptFirstCut * r
		if measured > 0 {
			next = adaptMargin * min(measured, r)
		}
		if a.guess {
			// A correction. The first one also tells the upstream's
			// burst: what the start served beyond the quota.
			if a.burst < 0 && a.startSpan > 0 && measured > 0 && a.startServed > measured*a.startSpan {
				a.burst = a.startServed - measured*a.startSpan
			}
			if a.probedFrom > 0 && next <= 1.1*a.probedFrom {
				// The probe's estimate was the burst, not more quota:
				// what it got beyond the quota just measured is the burst.
				a.burst = max(0, a.probeGot-measured*a.probeSpan)
				if a.fallen == 0 {
					a.plateau = min(adaptPlateauGrowth*a.plateau, adaptMaxPlateau)
				}
			}
		}
		if next < 0.9*a.held {
			// Below a level that held: the quota fell. Probe for its
			// return often and fast for a while.
			if a.fallen == 0 {
				a.fallen, a.fallPlateau = a.held, a.plateau
			}
			a.fallAt, a.held = now, 0
			a.plateau = adaptFallPlateau
		}
		// A long span may hold more than one quota (it fell within it):
		// then the next throttle measures again.
		a.guess, a.probedFrom = now.Sub(a.cutAt) > adaptLongSpan, 0
		if !a.guess {
			a.held = next
		}
	default:
		// A probe above a base that held was refused. What it got served
		// beyond the upstream's burst, over its span, is a floor of the
		// quota (the probe started below it, the bucket full).
		span := now.Sub(a.phaseAt).Seconds()
		a.probeGot, a.probeSpan = a.probeServed, span
		est := 0.0
		if span > 0 {
			est = a.probeServed / span
			if a.burst >= 0 {
				est = (a.probeServed - a.burst) / span
			}
		}
		switch {
		case a.burst < 0 && adaptMargin*est > 1.05*a.base:
			// An estimate with the burst in it: take it, and let its
			// throttle, if it is too high, measure.
			next = adaptMargin * est
			a.probedFrom, a.guess = a.base, true
			a.plateau = adaptMinPlateau
		default:
			// With the burst known the estimate is a floor: safe to take.
			// measured is a floor too (the bucket was empty at both
			// throttles); after a short plateau it is the closer one.
			next = max(a.base, adaptMargin*max(est, measured))
			a.held = next
			if next > 1.05*a.base {
				a.plateau = adaptMinPlateau // more room: look for more soon
			} else if a.fallen == 0 {
				a.plateau = min(adaptPlateauGrowth*a.plateau, adaptMaxPlateau) // the same ceiling
			}
		}
	}
	a.cuts++
	a.cutAt, a.served = now, 0
	a.phase, a.phaseAt = phasePlateau, now.Add(hold)
	a.set(next, now)
	a.base = a.want
}

// count folds one answer into seen, the answers a second decayed over the
// last second.
func (a *Law) count(now time.Time) {
	if a.firstAt.IsZero() {
		a.firstAt = now
	}
	if !a.last.IsZero() {
		if dt := now.Sub(a.last).Seconds(); dt > 0 {
			a.seen *= math.Exp(-dt)
		}
	}
	a.seen++
}

// advance moves the rate along its phase from a.last to now.
func (a *Law) advance(now time.Time) {
	prev := a.last
	if now.After(a.last) {
		a.last = now
	}
	if prev.IsZero() || !now.After(prev) {
		return
	}
	dt := now.Sub(prev).Seconds()
	if a.fallen > 0 && a.phase != phaseProbe && (now.Sub(a.fallAt) > adaptFallMemory || a.base >= 0.95*a.fallen) {
		// The fall is over, or old enough to be the new level.
		if a.base >= 0.95*a.fallen {
			a.plateau = max(a.plateau, a.fallPlateau) // back where it was
		} else {
			a.plateau = adaptMinPlateau
		}
		a.fallen = 0
	}
	used := a.seen >= adaptUsed*a.rate
	switch a.phase {
	case phaseStart:
		if used {
			a.set(a.want*math.Exp2(dt), now)
		}
	case phasePlateau:
		if now.Sub(a.phaseAt) >= a.plateau {
			a.phase, a.phaseAt, a.probeServed = phaseProbe, now, 0
		}
	case phaseProbe:
		if !used {
			a.phaseAt = a.phaseAt.Add(now.Sub(prev)) // the probe waits for work
			return
		}
		tau := now.Sub(a.phaseAt).Seconds()
		if a.fallen > 0 {
			// After a fall the probe is a step straight back to the level
			// that held before it: if the quota is back, it is all taken
			// at once; if not, it costs one throttle, as a ramp would.
			if tau >= adaptFallConfirm.Seconds() {
				// The old level holds again: the fall is over.
				a.base, a.held, a.fallen = a.want, a.want, 0
				a.phase, a.phaseAt = phasePlateau, now
				a.plateau = max(adaptMinPlateau, a.fallPlateau)
				return
			}
			a.set(a.fallen, now)
			return
		}
		// The probe's growth, in log-rate per second, rises with its age τ:
		// gentle at first, next to a known ceiling, then faster, so a
		// quota that grew a lot is found within seconds.
		a.set(a.want*math.Exp((adaptProbeG0+adaptProbeG1*tau)*dt), now)
	}
}

// own puts the limiter back at the law's rate if something else moved it.
// Why at every report and not only when the law moves: on a plateau the law
// stays put for minutes, and a rate written around it (an advertised
// policy, a caller's SetRate) would otherwise hold for as long, outside
// [min, max] perhaps, while Rate reports the law's.
func (a *Law) own() {
	if a.lim.Rate() != a.rate {
		_ = a.lim.SetRate(a.rate) // a rate the limiter refuses leaves it as it was
	}
}

func (a *Law) clamp(r float64) float64 {
	return max(a.min, min(r, a.max, a.ceiling))
}

// set makes r (clamped) the law's rate and moves the limiter to it when it
// differs enough to matter: SetRate re-times every parked waiter, so tiny
// steps are kept until they add up.
func (a *Law) set(r float64, now time.Time) {
	r = a.clamp(r)
	a.want = r
	small := r > a.rate && r-a.rate < adaptSetRateStep*a.rate && r != a.max && r != a.ceiling
	if r == a.rate || small {
		return // a fall is never deferred; a small rise waits for more
	}
	if err := a.lim.SetRate(r); err != nil {
		return // a rate the limiter refuses leaves it as it was
	}
	a.rate = r
	if a.log != nil && (r > a.logged*a.factor || r < a.logged/a.factor) {
		a.log.Info("adapt: rate changed", "from", a.logged, "to", r, "at", now)
		a.logged = r
	}
}
