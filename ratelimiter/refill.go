package ratelimiter

import (
	"context"
	"math"
	"math/bits"
	"time"
)

// The refill. Tokens accrue from base at rate per second: by time now,
// accrued(now) = floor((now−base)·rate) whole tokens, of which credited have
// been handed out already. Crediting is lazy: every call (and the refill
// timer) first credits the whole tokens accrued since the last credit, so
// the fraction carries over by itself and no state ticks while nobody looks.
// Whenever the bucket is full and nobody waits, base moves to now: a full
// bucket gains nothing, so idle time is never banked beyond Burst.
//
// Why not one timer tick per token (the reference's ticker fiber): a timer
// per token costs a wake-up per token even when nobody waits, and keeps a
// run alive. Here the timer is armed only while someone waits, for the exact
// instant the next whole token accrues, base + due(credited+1).

// Tokens accrue in exact integer arithmetic: the rate is held in
// nanotokens per second (rate·1e9, so 7.3/s is exactly 7_300_000_000), and
// d nanoseconds after base floor(d·nanoRate/1e18) whole tokens have accrued.
// The k-th token is due exactly ceil(k·1e18/nanoRate) ns after base, so a
// rate of 7.3/s delivers token 26280 at exactly 3600 s, with no float
// rounding to drift or to disagree between "is it due" and "when is it due".
const nanoScale = 1_000_000_000_000_000_000 // 1e18: ns per s × nanotokens per token

// accrued returns the whole tokens accrued d after base, and the fraction of
// the next one in units of 1/nanoScale. l.mu is held.
func (l *Limiter) accrued(d time.Duration) (whole int64, frac uint64) {
	if d <= 0 {
		return 0, 0
	}
	hi, lo := bits.Mul64(uint64(d), l.nanoRate)
	// hi < nanoScale always: d < 2^63 and nanoRate ≤ 1e18 (rate ≤ 1e9/s).
	q, r := bits.Div64(hi, lo, nanoScale)
	if q > math.MaxInt64/2 {
		return math.MaxInt64 / 2, 0
	}
	return int64(q), r
}

// due returns the offset from base at which k whole tokens have accrued, or
// neverDelay when that is beyond any timer. l.mu is held.
func (l *Limiter) due(k int64) time.Duration {
	hi, lo := bits.Mul64(uint64(k), nanoScale)
	if hi >= l.nanoRate {
		return neverDelay
	}
	q, r := bits.Div64(hi, lo, l.nanoRate)
	if r != 0 {
		q++
	}
	if q >= uint64(neverDelay) {
		return neverDelay
	}
	return time.Duration(q)
}

// credit hands out every whole token accrued by now: to the head of the
// queue first, then into the bucket up to Burst. l.mu is held.
func (l *Limiter) credit(now time.Time) {
	if l.queue.Len() == 0 && l.tokens >= l.burst {
		l.base, l.credited = now, 0
		return
	}
	whole, _ := l.accrued(now.Sub(l.base))
	k := whole - l.credited
	if k <= 0 {
		return
	}
	l.credited = whole
	l.give(k, now)
}

// give hands k tokens to the waiters from the head, in order, and the rest
// to the bucket, which keeps at most Burst. l.mu is held.
func (l *Limiter) give(k int64, now time.Time) {
	for k > 0 && l.queue.Front() != nil {
		wt := l.queue.Front()
		take := min(wt.n-wt.got, k)
		wt.got += take
		k -= take
		if wt.got < wt.n {
			break // k is 0: the head still waits for more
		}
		l.queue.Remove(wt)
		wt.granted = true
		if !wt.w.Wake() {
			// Its cancellation won the race; its OnCancel will find it out
			// of the queue. The tokens were never handed over: pass them on.
			wt.granted = false
			k += wt.got
			wt.got = 0
		}
	}
	if k > 0 {
		l.tokens = min(l.tokens+min(k, l.burst), l.burst)
	}
	if l.queue.Len() == 0 && l.tokens >= l.burst {
		// Full: nothing accrues from now on, fraction included.
		l.base, l.credited = now, 0
	}
}

// arm makes sure the refill timer fires when the next whole token accrues,
// if anyone waits for it, and disarms it otherwise. l.mu is held.
func (l *Limiter) arm(now time.Time) {
	if l.stopped || l.queue.Len() == 0 {
		if l.armed {
			l.timer.Stop()
			l.armed = false
		}
		return
	}
	l.armAt(now, l.base.Add(l.due(l.credited+1)))
}

// armAt arms the refill timer for at (at least 1 ns from now). l.mu is held.
func (l *Limiter) armAt(now, at time.Time) {
	if l.armed && l.timerAt.Equal(at) {
		return
	}
	d := max(at.Sub(now), 1)
	if l.timer == nil {
		l.timer = l.clock.AfterFunc(d, l.onTimer)
	} else {
		// A callback of an earlier arming may still be on its way (a real
		// timer firing as we reset it); it is harmless, since crediting is
		// computed from the clock and re-arms as needed.
		l.timer.Reset(d)
	}
	l.armed, l.timerAt = true, at
}

// onTimer is the refill: it credits what has accrued, wakes whoever that
// satisfies, and re-arms while anyone still waits. It runs on the clock's
// timer goroutine (the loop's goroutine under a virtual clock).
func (l *Limiter) onTimer() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.armed = false
	if l.stopped {
		return
	}
	now := l.now()
	if l.bucket != nil {
		l.serveShared()
		return
	}
	l.credit(now)
	l.arm(now)
}

// cancel is every waiter's OnCancel: it runs when the caller's context wins
// over a grant, before the caller resumes. It takes the waiter out of the
// queue and hands back every token it had collected, next waiter first.
func (wt *waiter) cancel() {
	l := wt.l
	l.mu.Lock()
	defer l.mu.Unlock()
	wasHead := l.queue.Front() == wt
	if wt.Queued() {
		l.queue.Remove(wt)
	}
	if l.stopped {
		return
	}
	if l.bucket != nil {
		if wasHead {
			l.serveShared() // the next in line tries at once
		}
		return
	}
	now := l.now()
	l.credit(now)
	got := wt.got
	wt.got = 0
	l.give(got, now)
	l.arm(now)
}

// wait parks on wt. When a run loop stops the parked fiber instead of
// resuming it (sched.Run ending while the fiber still waits: a deadlock, a
// panic in another fiber, a daemon that ignored its cancellation), a wait
// still pending ends through OnCancel, but a grant made just before the
// stop was never seen by the caller; abandon takes the waiter out of the
// queue if it is still there and gives such a grant back, so nothing is lost.
func (l *Limiter) wait(ctx context.Context, wt *waiter) error {
	returned := false
	defer func() {
		if !returned {
			l.abandon(wt)
		}
	}()
	err := wt.w.Wait(ctx)
	returned = true
	return err
}

// abandon undoes a wait whose fiber was stopped mid-wait. The waiter is not
// reused.
func (l *Limiter) abandon(wt *waiter) {
	l.mu.Lock()
	defer l.mu.Unlock()
	wasHead := l.queue.Front() == wt
	var back int64
	switch {
	case wt.Queued():
		l.queue.Remove(wt)
		back = wt.got
	case wt.granted:
		back = wt.n
	}
	wt.got = 0
	if l.stopped {
		return
	}
	if l.bucket != nil {
		// Shared waiters collect nothing while queued; a grant was
		// already spent in the table, so it stays with this process.
		l.prepaid += back
		if wasHead {
			l.serveShared()
		}
		return
	}
	now := l.now()
	l.credit(now)
	l.give(back, now)
	l.arm(now)
}
