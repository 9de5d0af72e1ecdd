package leasealloc_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/leasealloc"
	"github.com/sluice-go/sluice/lease"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

const sec = time.Second

func newAlloc(t *testing.T, alg leasealloc.Algorithm) *leasealloc.Allocator {
	t.Helper()
	a, err := leasealloc.New(leasealloc.Config{
		Policies: map[string]leasealloc.Policy{"p": {Rate: 100, Burst: 100}},
		Lease:    20 * sec, Refresh: 5 * sec, Algorithm: alg, NoLearning: true,
		MaxKeys: 4, MaxHolders: 3,
	}, t0)
	require.NoError(t, err)
	return a
}

// holder is a well-behaved replica of the tests: it applies every grant it
// receives and acknowledges it on the next request.
type holder struct {
	name       string
	token      string
	seq        uint64
	rate       float64
	burst      int64
	until      time.Time // its own expiry: from when it sent
	want       float64
	waiting    bool
	limit      float64
	limitBurst int64
	lastErr    error
	capToWant  bool
}

func (h *holder) request(now time.Time) *lease.Request {
	// It reports what it enforces at now: nothing once its lease expired.
	r, b := h.inForce(now)
	if h.capToWant && !h.waiting && h.want < r {
		// lowers its own share: what it enforces from now on
		b = max(int64(float64(b)*h.want/r), 0)
		r = h.want
		h.rate, h.burst = r, b
	}
	return &lease.Request{Holder: h.name, Keys: []lease.KeyRequest{{
		Policy: "p", Key: "k", Token: h.token, Seq: h.seq, HaveRate: r, HaveBurst: b,
		Want: h.want, Waiting: h.waiting}}}
}

func (h *holder) apply(sent time.Time, resp *lease.Response) {
	g := resp.Keys[0]
	h.lastErr = lease.Err(g.Error, g.Message)
	if h.lastErr != nil {
		return
	}
	if g.Token != h.token {
		h.token, h.seq = g.Token, 0
	}
	if g.Seq > h.seq {
		h.seq, h.rate, h.burst = g.Seq, g.Rate, g.Burst
		h.until = sent.Add(time.Duration(g.ExpiresMS) * time.Millisecond)
		h.limit, h.limitBurst = g.LimitRate, g.LimitBurst
	}
}

func (h *holder) renew(t *testing.T, a *leasealloc.Allocator, now time.Time) {
	t.Helper()
	resp, err := a.RenewAt(now, h.request(now))
	require.NoError(t, err)
	h.apply(now, resp)
}

// inForce is the share the holder enforces at now.
func (h *holder) inForce(now time.Time) (float64, int64) {
	if now.Before(h.until) {
		return h.rate, h.burst
	}
	return 0, 0
}

func TestFairShareWaterFilling(t *testing.T) {
	a := newAlloc(t, leasealloc.FairShare)
	hs := []*holder{{name: "a", want: 10}, {name: "b", want: 60}, {name: "c", want: 80}}
	// Two rounds: the first hands out what is free in arrival order, the
	// second, with every demand known and acknowledged, the fair shares.
	for round := range 3 {
		now := t0.Add(time.Duration(round) * 5 * sec)
		for _, h := range hs {
			h.renew(t, a, now)
		}
	}
	assert.InDelta(t, 10, hs[0].rate, 1e-9)
	assert.InDelta(t, 45, hs[1].rate, 1e-9)
	assert.InDelta(t, 45, hs[2].rate, 1e-9)
	assert.Equal(t, []int64{10, 45, 45}, []int64{hs[0].burst, hs[1].burst, hs[2].burst})
	r, b := a.ReservedAt(t0.Add(10*sec), "p", "k")
	assert.InDelta(t, 100, r, 1e-9)
	assert.Equal(t, int64(100), b)
}

func TestProportional(t *testing.T) {
	a := newAlloc(t, leasealloc.Proportional)
	hs := []*holder{{name: "a", want: 50}, {name: "b", want: 150}}
	for round := range 3 {
		for _, h := range hs {
			h.renew(t, a, t0.Add(time.Duration(round)*5*sec))
		}
	}
	// b's demand counts as the policy's rate, 100, at most.
	assert.InDelta(t, 100.0*50/150, hs[0].rate, 1e-3)
	assert.InDelta(t, 100.0*100/150, hs[1].rate, 1e-3)
}

// A shrink frees capacity for others only once acknowledged: until then the
// newcomer gets nothing of it.
func TestShrinkFreesOnlyOnAck(t *testing.T) {
	a := newAlloc(t, leasealloc.FairShare)
	x := &holder{name: "x", waiting: true}
	x.renew(t, a, t0)
	require.InDelta(t, 100, x.rate, 1e-9)
	y := &holder{name: "y", waiting: true}
	y.renew(t, a, t0.Add(1*sec))
	assert.Zero(t, y.rate, "nothing is free while x holds everything")
	// x is told to shrink to 50, but the response is lost.
	_, err := a.RenewAt(t0.Add(2*sec), x.request(t0.Add(2*sec)))
	require.NoError(t, err)
	y.renew(t, a, t0.Add(3*sec))
	assert.Zero(t, y.rate, "x's smaller share is not acknowledged: still nothing for y")
	// x renews again (acknowledging its old grant only), gets 50 again.
	x.renew(t, a, t0.Add(4*sec))
	assert.InDelta(t, 50, x.rate, 1e-9)
	y.renew(t, a, t0.Add(5*sec))
	assert.Zero(t, y.rate, "x has the 50 grant but has not said so")
	x.renew(t, a, t0.Add(6*sec)) // acknowledges 50
	y.renew(t, a, t0.Add(7*sec))
	assert.InDelta(t, 50, y.rate, 1e-9)
}

// A holder that wants less and lowers its own share frees the difference
// in the same request: others get it at their next renewal.
func TestVoluntaryShrinkFreesAtOnce(t *testing.T) {
	a := newAlloc(t, leasealloc.FairShare)
	x := &holder{name: "x", want: 100, capToWant: true}
	x.renew(t, a, t0)
	x.renew(t, a, t0.Add(5*sec))
	y := &holder{name: "y", want: 60}
	y.renew(t, a, t0.Add(6*sec))
	assert.Zero(t, y.rate)
	x.want = 30
	x.renew(t, a, t0.Add(10*sec))
	assert.InDelta(t, 30, x.rate, 1e-9)
	y.renew(t, a, t0.Add(11*sec))
	assert.InDelta(t, 60, y.rate, 1e-9)
}

// A holder that vanishes keeps its reservation until its lease expires,
// and not a moment longer.
func TestDeadHolderFreesAtExpiry(t *testing.T) {
	a := newAlloc(t, leasealloc.FairShare)
	x := &holder{name: "x", waiting: true}
	x.renew(t, a, t0)
	y := &holder{name: "y", waiting: true}
	y.renew(t, a, t0.Add(19*sec))
	assert.Zero(t, y.rate)
	y.renew(t, a, t0.Add(20*sec))
	assert.InDelta(t, 100, y.rate, 1e-9)
	assert.Equal(t, 1, a.Stats().Leases)
}

func TestReleaseFreesAtOnce(t *testing.T) {
	a := newAlloc(t, leasealloc.FairShare)
	x := &holder{name: "x", waiting: true}
	x.renew(t, a, t0)
	req := x.request(t0.Add(2 * sec))
	req.Keys[0].Release = true
	resp, err := a.RenewAt(t0.Add(sec), req)
	require.NoError(t, err)
	require.Empty(t, resp.Keys[0].Error)
	r, _ := a.ReservedAt(t0.Add(sec), "p", "k")
	assert.Zero(t, r)
	// giving back again: not held
	resp, err = a.RenewAt(t0.Add(2*sec), req)
	require.NoError(t, err)
	assert.ErrorIs(t, lease.Err(resp.Keys[0].Error, resp.Keys[0].Message), lease.ErrNotHeld)
}

func TestRefusals(t *testing.T) {
	a := newAlloc(t, leasealloc.FairShare)
	one := func(kr lease.KeyRequest) error {
		resp, err := a.RenewAt(t0, &lease.Request{Holder: "h", Keys: []lease.KeyRequest{kr}})
		require.NoError(t, err)
		g := resp.Keys[0]
		if g.Error == "" {
			return nil
		}
		assert.NotEmpty(t, g.Message)
		assert.Zero(t, g.Rate)
		return lease.Err(g.Error, g.Message)
	}
	for _, w := range []float64{math.NaN(), -1, math.Inf(1), math.Inf(-1)} {
		assert.ErrorIs(t, one(lease.KeyRequest{Policy: "p", Key: "k", Want: w}), lease.ErrBadDemand, "want %v", w)
		assert.ErrorIs(t, one(lease.KeyRequest{Policy: "p", Key: "k", HaveRate: w}), lease.ErrBadDemand, "have %v", w)
	}
	assert.ErrorIs(t, one(lease.KeyRequest{Policy: "p", Key: "k", HaveBurst: -1}), lease.ErrBadDemand)
	assert.ErrorIs(t, one(lease.KeyRequest{Policy: "nope", Key: "k"}), lease.ErrUnknownPolicy)
	assert.ErrorIs(t, one(lease.KeyRequest{Policy: "p", Key: ""}), lease.ErrBadRequest)

	_, err := a.RenewAt(t0, &lease.Request{Holder: "h", Keys: make([]lease.KeyRequest, 5)})
	assert.ErrorIs(t, err, lease.ErrTooManyKeys)
	_, err = a.RenewAt(t0, &lease.Request{Holder: "", Keys: nil})
	assert.ErrorIs(t, err, lease.ErrBadRequest)

	// A key twice in one request: the second is refused.
	resp, err := a.RenewAt(t0, &lease.Request{Holder: "d", Keys: []lease.KeyRequest{{Policy: "p", Key: "k"}, {Policy: "p", Key: "k"}}})
	require.NoError(t, err)
	assert.Empty(t, resp.Keys[0].Error)
	assert.Equal(t, "bad_request", resp.Keys[1].Error)

	// Too many holders: the table takes 3 ("d" holds one already).
	for i := range 2 {
		require.NoError(t, one2(t, a, fmt.Sprint("x", i)))
	}
	assert.ErrorIs(t, one2(t, a, "x9"), lease.ErrTooManyHolders)

	// Wrong token, and a second process under the same holder name.
	resp, err = a.RenewAt(t0, &lease.Request{Holder: "d", Keys: []lease.KeyRequest{{Policy: "p", Key: "k", Token: "forged"}}})
	require.NoError(t, err)
	assert.ErrorIs(t, lease.Err(resp.Keys[0].Error, resp.Keys[0].Message), lease.ErrNotHeld)
	assert.ErrorIs(t, one2(t, a, "d"), lease.ErrNotHeld)

	s := a.Stats()
	assert.Equal(t, int64(9), s.BadDemand)
	assert.Equal(t, int64(1), s.UnknownPolicy)
	assert.Equal(t, int64(3), s.BadRequest)
	assert.Equal(t, int64(1), s.TooManyKeys)
	assert.Equal(t, int64(1), s.TooManyHolders)
	assert.Equal(t, int64(2), s.NotHeld)
	assert.Equal(t, 3, s.Leases)
}

// one2 asks for a new lease as holder h.
func one2(t *testing.T, a *leasealloc.Allocator, h string) error {
	resp, err := a.RenewAt(t0, &lease.Request{Holder: h, Keys: []lease.KeyRequest{{Policy: "p", Key: "k", Want: 1}}})
	require.NoError(t, err)
	return lease.Err(resp.Keys[0].Error, resp.Keys[0].Message)
}

func TestNewRefusesBadConfig(t *testing.T) {
	for _, c := range []leasealloc.Config{
		{Policies: map[string]leasealloc.Policy{"p": {Rate: 0, Burst: 1}}},
		{Policies: map[string]leasealloc.Policy{"p": {Rate: math.NaN(), Burst: 1}}},
		{Policies: map[string]leasealloc.Policy{"p": {Rate: 1, Burst: 0}}},
		{Policies: map[string]leasealloc.Policy{"p": {Rate: 2e9, Burst: 1}}},
		{Lease: 10 * sec, Refresh: 6 * sec},
		{MaxHolders: -1},
		{Algorithm: 7},
	} {
		_, err := leasealloc.New(c, t0)
		assert.Error(t, err, "%+v", c)
	}
}

// After a restart, the allocator renews what holders report they enforce
// and grants nothing new for one lease length.
func TestLearningMode(t *testing.T) {
	a := newAlloc(t, leasealloc.FairShare)
	x := &holder{name: "x", want: 70}
	x.renew(t, a, t0)
	x.renew(t, a, t0.Add(5*sec))
	require.InDelta(t, 70, x.rate, 1e-9)

	restart := t0.Add(7 * sec)
	b, err := leasealloc.New(leasealloc.Config{
		Policies: map[string]leasealloc.Policy{"p": {Rate: 100, Burst: 100}}, Lease: 20 * sec, Refresh: 5 * sec}, restart)
	require.NoError(t, err)
	assert.True(t, b.Learning(restart))
	y := &holder{name: "y", want: 30}
	y.renew(t, b, restart)
	assert.Zero(t, y.rate, "a new holder waits out learning")
	x.want = 100
	x.renew(t, b, restart.Add(3*sec))
	assert.InDelta(t, 70, x.rate, 1e-9, "a known holder keeps its share, no more")
	assert.True(t, x.until.After(restart.Add(20*sec)), "and it is renewed")
	hs := b.HoldersAt(restart.Add(3*sec), "p", "k")
	require.Len(t, hs, 2)
	assert.True(t, hs[0].LearnedFromPeer)

	// A holder that had a lease but does not renew during learning: its old
	// lease ends by restart+Lease, which is when learning ends.
	end := restart.Add(20 * sec)
	assert.False(t, b.Learning(end))
	y.renew(t, b, end)
	assert.InDelta(t, 30, y.rate, 1e-9)
	x.renew(t, b, end.Add(sec))
	assert.InDelta(t, 70, x.rate, 1e-9)
}

// The invariant under random operations: replicas that renew, lose answers,
// replay old requests late, lower their own share, give back, die and come
// back, and a server that restarts. At every step, (1) the server's
// reservations stay within the policy and (2) so do the shares the replicas
// actually enforce, each until its own expiry (counted from when it sent).
func TestInvariantRandomized(t *testing.T) {
	seeds := 30
	if testing.Short() || raceEnabled {
		seeds = 10
	}
	for seed := range uint64(seeds) {
		invariantRun(t, seed)
	}
}

func invariantRun(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 39))
	const rate, burst = 50.0, 40
	cfg := leasealloc.Config{Policies: map[string]leasealloc.Policy{"p": {Rate: rate, Burst: burst}},
		Lease: 10 * sec, Refresh: 2 * sec, NoLearning: true,
		Algorithm: leasealloc.Algorithm(rng.IntN(2)), MaxHolders: 6}
	now := t0
	a, err := leasealloc.New(cfg, now)
	require.NoError(t, err)
	cfg.NoLearning = false
	type replica struct {
		*holder
		old []*lease.Request // requests sent earlier, for late replays
	}
	rs := make([]*replica, 8)
	for i := range rs {
		rs[i] = &replica{holder: &holder{name: fmt.Sprint("r", i), capToWant: rng.IntN(2) == 0}}
	}
	peak := 0.0 // the largest sum of enforced rates seen
	for step := range 3000 {
		now = now.Add(time.Duration(rng.IntN(1500)) * time.Millisecond)
		r := rs[rng.IntN(len(rs))]
		switch op := rng.IntN(100); {
		case op < 55: // renew
			r.want = float64(rng.IntN(60))
			r.waiting = rng.IntN(4) == 0
			req := r.request(now)
			r.old = append(r.old, req)
			resp, err := a.RenewAt(now, req)
			require.NoError(t, err)
			if rng.IntN(6) > 0 { // else the answer is lost
				r.apply(now, resp)
			}
		case op < 65: // a late copy of an old request reaches the server
			if len(r.old) > 0 {
				_, err := a.RenewAt(now, r.old[rng.IntN(len(r.old))])
				require.NoError(t, err)
			}
		case op < 70: // give back: cap at zero first
			req := r.request(now)
			req.Keys[0].Release = true
			r.rate, r.burst, r.until = 0, 0, time.Time{}
			_, err := a.RenewAt(now, req)
			require.NoError(t, err)
			r.token, r.seq = "", 0
		case op < 73: // the replica dies; a new process takes its name
			r.holder = &holder{name: r.name, capToWant: r.capToWant}
			r.old = nil
		case op < 74: // the server restarts
			a, err = leasealloc.New(cfg, now)
			require.NoError(t, err)
		}
		for _, check := range []time.Time{now, now.Add(time.Millisecond)} {
			sr, sb := a.ReservedAt(check, "p", "k")
			require.LessOrEqual(t, sr, rate+1e-9, "seed %d step %d: reserved rate", seed, step)
			require.LessOrEqual(t, sb, int64(burst), "seed %d step %d: reserved burst", seed, step)
			var cr float64
			var cb int64
			for _, x := range rs {
				xr, xb := x.inForce(check)
				cr += xr
				cb += xb
			}
			if cr > rate+1e-9 {
				for _, x := range rs {
					xr, xb := x.inForce(check)
					t.Logf("%s: in force %v %v seq %d token %s until %v", x.name, xr, xb, x.seq, x.token, x.until.Sub(t0))
				}
				for _, h := range a.HoldersAt(check, "p", "k") {
					t.Logf("server %+v", h)
				}
			}
			require.LessOrEqual(t, cr, rate+1e-9, "seed %d step %d: enforced rate", seed, step)
			peak = max(peak, cr)
			require.LessOrEqual(t, cb, int64(burst), "seed %d step %d: enforced burst", seed, step)
		}
	}
	require.Positive(t, peak, "seed %d: nothing was ever granted: the run proves nothing", seed)
}

func TestErrCodesRoundTrip(t *testing.T) {
	for _, e := range []error{lease.ErrBadRequest, lease.ErrBadDemand, lease.ErrUnknownPolicy,
		lease.ErrTooManyKeys, lease.ErrTooManyHolders, lease.ErrNotHeld} {
		w := fmt.Errorf("ctx: %w", e)
		back := lease.Err(lease.Code(w), w.Error())
		assert.ErrorIs(t, back, e)
		assert.Equal(t, w.Error(), back.Error())
	}
	assert.Nil(t, lease.Err("", ""))
	assert.False(t, errors.Is(lease.Err("weird", ""), lease.ErrNotHeld))
	assert.Equal(t, "error", lease.Code(errors.New("x")))
}

// In learning mode the adopted shares form a pool: what a learned holder
// gives up goes to another holder, and never more than the pool.
func TestLearningPool(t *testing.T) {
	a := newAlloc(t, leasealloc.FairShare)
	x := &holder{name: "x", want: 60, capToWant: true}
	x.renew(t, a, t0)
	x.renew(t, a, t0.Add(5*sec))
	restart := t0.Add(6 * sec)
	b, err := leasealloc.New(leasealloc.Config{
		Policies: map[string]leasealloc.Policy{"p": {Rate: 100, Burst: 100}}, Lease: 20 * sec, Refresh: 5 * sec}, restart)
	require.NoError(t, err)
	y := &holder{name: "y", want: 50}
	y.renew(t, b, restart)
	assert.Zero(t, y.rate, "the pool is empty")
	x.want = 20
	x.renew(t, b, restart.Add(sec)) // adopted at 20 (it lowered itself first)
	assert.InDelta(t, 20, x.rate, 1e-9)
	y.renew(t, b, restart.Add(2*sec))
	assert.Zero(t, y.rate, "x's 40 was given up before the restart: not learned of")
	x.want = 5
	x.renew(t, b, restart.Add(3*sec))
	y.renew(t, b, restart.Add(4*sec))
	assert.InDelta(t, 15, y.rate, 1e-9, "what x gave up after adoption goes to y")
	r, _ := b.ReservedAt(restart.Add(4*sec), "p", "k")
	assert.InDelta(t, 20, r, 1e-9, "the pool's 20, no more")
}
