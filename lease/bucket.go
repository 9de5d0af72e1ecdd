package lease

import (
	"fmt"
	"math"
	"math/bits"
	"sync"
	"time"
)

// Bucket is one key's share as a local token bucket: it refills at the
// share's rate and holds at most its burst, both following the grants of
// the key's lease. It satisfies ratelimiter.SharedBucket. Get one from
// Client.Bucket; its methods are safe for concurrent use and never block.
//
// A new Bucket, and capacity a grant adds, start empty: tokens appear only
// by refill at the granted rate, never by a grant, which is what keeps the
// sum over replicas within the policy (see the package doc).
type Bucket struct {
	c           *Client
	policy, key string

	mu        sync.Mutex
	token     string
	seq       uint64
	rate      int64 // thousandths of a token a second
	burst     int64
	until     time.Time // local expiry: sent + expires − margin
	limRate   float64
	limBurst  int64
	pico      uint64    // tokens held, in 10⁻¹² tokens (exact refills)
	last      time.Time // of the last refill
	want      float64   // declared demand, < 0 to measure
	admitted  int64     // tokens granted since the last report
	since     time.Time // of the last report
	waited    bool      // a caller was refused or waited since
	releasing bool
	err       error
}

const pico uint64 = 1_000_000_000_000

// maxPicoBurst bounds a bucket's burst so that its tokens fit in a uint64
// of 10⁻¹² tokens; a larger share burst is held as this (less, so safe).
const maxPicoBurst = int64(math.MaxUint64 / pico)

// known reports whether the bucket ever had a grant.
func (b *Bucket) known() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.limBurst > 0
}

// share returns the share in force at now.
func (b *Bucket) share(now time.Time) (int64, int64) {
	if b.releasing || (b.c.failClosed() && !now.Before(b.until)) {
		return 0, 0
	}
	return b.rate, b.burst
}

// refill brings the tokens to now, at the rate in force, and caps them at
// the burst in force.
func (b *Bucket) refill(now time.Time) {
	if !now.After(b.last) {
		return
	}
	from := b.last
	b.last = now
	if b.c.failClosed() && now.After(b.until) {
		// the share ends at until: refill to it, then nothing
		if from.Before(b.until) {
			b.add(b.rate, b.burst, b.until.Sub(from))
		}
		b.pico = 0
		return
	}
	b.add(b.rate, b.burst, now.Sub(from))
}

// add credits rate (thousandths a second) over d, up to burst.
func (b *Bucket) add(rate, burst int64, d time.Duration) {
	if b.releasing {
		b.pico = 0
		return
	}
	capPico := uint64(min(burst, maxPicoBurst)) * pico
	if b.pico >= capPico {
		b.pico = capPico
		return
	}
	// thousandths a second × nanoseconds = 10⁻¹² tokens, exactly
	hi, lo := bits.Mul64(uint64(rate), uint64(d))
	if room := capPico - b.pico; hi != 0 || lo >= room {
		b.pico = capPico
	} else {
		b.pico += lo
	}
}

// AllowN spends n tokens if the share holds them now, all or nothing.
func (b *Bucket) AllowN(n int64) bool {
	now := b.c.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if n <= 0 {
		return true
	}
	b.refill(now)
	if n > maxPicoBurst || b.pico < uint64(n)*pico {
		b.waited = true
		return false
	}
	b.pico -= uint64(n) * pico
	b.admitted += n
	return true
}

// never is what RetryAfterN returns when waiting cannot help.
const never = time.Duration(math.MaxInt64)

// RetryAfterN is how long until n tokens may be there: the time to refill
// them at the share's rate, but no later than the next renewal, which may
// change the share. It is math.MaxInt64 (never) for n above the policy's
// burst.
func (b *Bucket) RetryAfterN(n int64) time.Duration {
	now := b.c.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if n > b.limBurst || n > maxPicoBurst {
		return never
	}
	b.refill(now)
	need := uint64(max(n, 0)) * pico
	if b.pico >= need {
		return 0
	}
	b.waited = true
	next := time.Duration(b.c.nextAt.Load() - now.UnixNano())
	if next <= 0 {
		next = time.Duration(b.c.refresh.Load())
	}
	rate, burst := b.share(now)
	if rate <= 0 || burst < n {
		return next
	}
	d := time.Duration((need - b.pico + uint64(rate) - 1) / uint64(rate)) // ns, rounded up
	if b.c.failClosed() && now.Add(d).After(b.until) {
		return next
	}
	return min(d, next)
}

// Remaining is the tokens the bucket holds now.
func (b *Bucket) Remaining() float64 {
	now := b.c.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(now)
	return float64(b.pico) / float64(pico)
}

// Rate is the share's rate in force now, tokens a second.
func (b *Bucket) Rate() float64 {
	now := b.c.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	r, _ := b.share(now)
	return float64(r) / 1000
}

// Burst is the policy's burst: the largest share this key can be granted,
// so the most tokens any one wait can ask for (ratelimiter.Shared fails an
// Acquire above it at once). The share's burst in force now is Share's.
func (b *Bucket) Burst() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.limBurst
}

// Share is the share in force now and when it ends here (zero before a
// grant, and at zero rate once given back).
func (b *Bucket) Share() (rate float64, burst int64, until time.Time) {
	now := b.c.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	r, bu := b.share(now)
	return float64(r) / 1000, bu, b.until
}

// Limit is the policy's rate and burst, shared by every holder of the key.
func (b *Bucket) Limit() (rate float64, burst int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.limRate, b.limBurst
}

// Want declares the key's demand, in tokens a second, reported at each
// renewal instead of the measured one (a negative rate goes back to
// measuring, and +Inf asks for all the policy gives). While the share is
// above a declared demand the bucket lowers its own share to it at the
// next renewal, which frees the difference for other replicas at once.
func (b *Bucket) Want(rate float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if rate != rate { // NaN: measure
		rate = -1
	}
	// Why the cap: more than any policy's rate (leasealloc.MaxRate) means
	// "all it will give", and keeps the thousandths within an int64.
	b.want = min(rate, 1e12)
}

// Err is the server's last refusal of this key (nil after a grant).
func (b *Bucket) Err() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// Release gives the lease back: the bucket grants nothing from now on,
// and the next renewal tells the server, which frees the share at once.
func (b *Bucket) Release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.releasing = true
	b.pico = 0
}

// measuredHeadroom is added to a measured demand: a replica that used all
// it was given reports a little more, so that its share can grow while
// others want less; a declared demand is taken as it is.
const measuredHeadroom = 1.1

// report returns the key's part of a renewal sent at now, lowering the
// share first to a declared demand below it.
func (b *Bucket) report(now time.Time) KeyRequest {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(now)
	kr := KeyRequest{Policy: b.policy, Key: b.key, Token: b.token, Release: b.releasing}
	if b.releasing {
		return kr
	}
	rate, burst := b.share(now)
	if !now.Before(b.until) {
		// Expired: whatever store.FailOpen still grants, no lease is in force.
		rate, burst = 0, 0
	}
	if b.want >= 0 {
		kr.Want = b.want
		if w := int64(b.want * 1000); w < rate {
			// Lower our own share to the demand, now: the server learns it
			// in this request, so it can re-grant the rest at once.
			burst = max(int64(float64(burst)*float64(w)/float64(rate)), min(burst, 1))
			if w == 0 {
				burst = 0
			}
			rate = w
			b.rate, b.burst = rate, burst
			b.pico = min(b.pico, uint64(burst)*pico)
		}
	} else {
		if el := now.Sub(b.since); b.since.IsZero() || el <= 0 {
			// Nothing measured yet: a new key asks for a fair share.
			kr.Want, b.waited = float64(rate)/1000, true
		} else {
			kr.Want = float64(b.admitted) / el.Seconds() * measuredHeadroom
		}
		kr.Waiting = b.waited
	}
	if rate > 0 || burst > 0 {
		kr.Seq, kr.HaveRate, kr.HaveBurst = b.seq, float64(rate)/1000, burst
	} else if b.seq > 0 {
		// Nothing in force (expired, or lowered to zero): say so under the
		// grant we hold, so that nothing stays reserved for us.
		kr.Seq = b.seq
	}
	b.admitted, b.since, b.waited = 0, now, false
	return kr
}

// maxMS is the most milliseconds a Duration holds: a server's expires_ms
// or refresh_ms above it would wrap.
const maxMS = int64(math.MaxInt64 / time.Millisecond)

// checkGrant reports why a grant's numbers cannot be a share: a rate that
// is not finite or is negative (or is more thousandths than an int64
// holds), a negative burst, an expiry that is not positive or does not fit
// a Duration.
func checkGrant(g *Grant) error {
	switch {
	case !(g.Rate >= 0 && g.Rate <= 1e12): // !(…) catches NaN
		return fmt.Errorf("lease: server granted rate %v for policy %q key %.40q: want a finite rate ≥ 0", g.Rate, g.Policy, g.Key)
	case g.Burst < 0:
		return fmt.Errorf("lease: server granted burst %d for policy %q key %.40q: want ≥ 0", g.Burst, g.Policy, g.Key)
	case g.ExpiresMS <= 0 || g.ExpiresMS > maxMS:
		return fmt.Errorf("lease: server granted expires_ms %d for policy %q key %.40q: want 1 to %d", g.ExpiresMS, g.Policy, g.Key, maxMS)
	}
	return nil
}

// apply takes the server's answer to a renewal sent at sent, reporting
// whether the bucket is done (given back).
func (b *Bucket) apply(sent time.Time, kr *KeyRequest, g *Grant) bool {
	now := b.c.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if kr.Release {
		return true
	}
	if err := Err(g.Error, g.Message); err != nil {
		b.err = err
		if kr.Token != "" && errorsIsNotHeld(err) {
			// The server holds no lease of ours under this token (it
			// expired there, so here too): ask afresh next time.
			b.token, b.seq = "", 0
		}
		return false
	}
	if err := checkGrant(g); err != nil {
		// Why refuse and keep the share in force: a negative rate or burst
		// would wrap in the unsigned refill into a bucket without bound,
		// and an expiry past a Duration into any instant; the share held
		// ends at its own expiry if no good grant comes.
		b.err = err
		return false
	}
	b.err = nil
	b.limRate, b.limBurst = g.LimitRate, g.LimitBurst
	if g.Token != b.token {
		b.token, b.seq = g.Token, 0
	}
	if g.Seq <= b.seq {
		return false
	}
	b.refill(now) // at the old share, up to now
	b.seq = g.Seq
	b.rate = int64(math.Round(g.Rate * 1000))
	b.burst = g.Burst
	life := time.Duration(g.ExpiresMS) * time.Millisecond
	b.until = sent.Add(life - time.Duration(float64(life)*b.c.drift))
	if c := uint64(min(b.burst, maxPicoBurst)) * pico; b.pico > c {
		b.pico = c // a smaller share caps the bucket at once
	}
	if b.last.IsZero() {
		b.last = now
	}
	return false
}
