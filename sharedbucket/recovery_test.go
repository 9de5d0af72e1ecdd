//go:build linux || darwin

package sharedbucket

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/store"
)

// lockedSlots returns the locked key words of tb by slot, by a raw walk.
func lockedSlots(tb *Table) map[uint64]uint64 {
	m := map[uint64]uint64{}
	for i := range uint64(tb.nslots) {
		if k := slotAt(tb.slots, i).key.Load(); k&lockBit != 0 {
			m[i] = k
		}
	}
	return m
}

// sweepClaims claims a new key whose probe window starts at every slot of
// the table, at time at: every slot is looked at by some claim.
func sweepClaims(tb *Table, at int64) {
	for i := range uint64(tb.nslots) {
		tb.decideFrom(hashAt(i, 1<<20+i), 1, at, false, nil)
	}
}

// lockOf returns a lock word taken at time at by process pid.
func lockOf(at int64, pid uint64) uint64 {
	return lockBit | uint64(at>>lockShift)<<pidBits | pid
}

// TestKillLoopLeavesNoLock: 3 processes claim slots for keys seen once
// each (every call claims a slot, as client IPs would) and are SIGKILLed
// mid-call, 150 rounds of 3 kills. A kill that lands while a process holds
// a slot's lock leaves the slot locked; the next claims that look at it
// take it over once its process is gone or it is LockTimeout old. After
// the loop and the bound (claims dated LockTimeout later), no slot is
// locked. (Lock words that named only the slot's old owner, which a key
// seen once never comes back to release, left about a tenth of the kills'
// slots locked for good.)
func TestKillLoopLeavesNoLock(t *testing.T) {
	p := Policy{Limit: 1000, Window: time.Second, Burst: 10}
	const slots, procs, rounds = 1024, 3, 150
	path := filepath.Join(tmpfsDir(t), "kill.sbt")
	tb, err := Open(path, p, WithSlots(slots))
	require.NoError(t, err)
	defer tb.Close()
	env := []string{pathEnv + "=" + path, policyEnv + "=" + encodePolicy(p, slots)}
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	kills, most := 0, 0
	left := map[[2]uint64]bool{} // locks left by kills: {slot, lock word}
	var locked map[uint64]uint64
	for range rounds {
		kids := make([]*child, procs)
		for i := range kids {
			kids[i] = startChild(t, childRoleG, env...)
		}
		for _, c := range kids {
			require.Equal(t, "ready", c.line(t))
		}
		// Let them claim for a random 1–5 ms, then kill them mid-call.
		time.Sleep(time.Duration(1+r.IntN(5)) * time.Millisecond)
		for _, c := range kids {
			require.NoError(t, c.cmd.Process.Signal(syscall.SIGKILL))
		}
		for _, c := range kids {
			_ = c.cmd.Wait()
			kills++
		}
		// Every process is dead now: each lock in the table is one a kill
		// left behind.
		locked = lockedSlots(tb)
		for i, w := range locked {
			left[[2]uint64{i, w}] = true
		}
		most = max(most, len(locked))
	}
	sweepClaims(tb, Now()+int64(LockTimeout))
	after := lockedSlots(tb)
	st := tb.Stats()
	t.Logf("%d rounds, %d kills: %d locks left by kills (%.1f%%), at most %d of %d slots locked at once, %d at the end of the loop; "+
		"after the bound (LockTimeout %v): %d locked (Stats.Locked %d), %d taken over by the sweep",
		rounds, kills, len(left), 100*float64(len(left))/float64(kills), most, slots, len(locked),
		LockTimeout, len(after), st.Locked, st.Recovered)
	require.NotEmpty(t, left, "no kill landed mid-claim: the test checked nothing")
	assert.Empty(t, after, "slots still locked after the bound")
	assert.Zero(t, st.Locked)
	assert.EqualValues(t, len(locked), st.Recovered, "every lock left at the end was taken over by the sweep, and counted")
}

// TestLockTimeout: a probe window whose every slot is locked by a process
// that is alive but stopped (this one's id) refuses a new key (here with
// FailClosed) until the locks are LockTimeout old, then takes them over
// and counts them.
func TestLockTimeout(t *testing.T) {
	tb := openTemp(t, slotPolicy, WithSlots(64), WithFailMode(store.FailClosed))
	// Judged by the locks' own time only (a claim that waited on a lock
	// for LockTimeout of real time would take it over too, see
	// TestDeadHolderTakenOver).
	lockWatch = time.Hour
	defer func() { lockWatch = LockTimeout }()
	at := t0 &^ (lockUnit - 1) // a lock time as a lock word keeps it
	for i := range uint64(probeWindow) {
		slotAt(tb.slots, i).key.Store(lockOf(at, lockPID))
	}
	h := hashAt(0, 1)
	require.False(t, tb.decideFrom(h, 1, at+int64(LockTimeout)-1, false, nil).ok, "locks just younger than LockTimeout are held")
	assert.Len(t, lockedSlots(tb), probeWindow)
	c := tb.counters()
	assert.Zero(t, c.Recovered+c.Corrupt)
	assert.EqualValues(t, 1, c.Contended)

	require.True(t, tb.decideFrom(h, 1, at+int64(LockTimeout), false, nil).ok, "LockTimeout old: taken over")
	st := tb.Stats()
	assert.Zero(t, st.Locked)
	assert.EqualValues(t, probeWindow, st.Recovered)
	assert.Zero(t, st.Corrupt)
}

// TestDeadHolderTakenOver: a lock whose process has exited is taken over
// by a claim that waited on it, without waiting for LockTimeout (here the
// claim would otherwise watch a lock for an hour); a lock of a live process
// (this one) is waited on until the claim has watched it for LockTimeout:
// it may be a claim of the same key (see TestClaimWaitsForStalledClaim).
func TestDeadHolderTakenOver(t *testing.T) {
	c := startChild(t, childRoleE)
	c.line(t)
	require.NoError(t, c.cmd.Wait())
	dead := uint64(c.cmd.Process.Pid)
	require.ErrorIs(t, syscall.Kill(int(dead), 0), syscall.ESRCH)

	t.Run("dead", func(t *testing.T) {
		tb := openTemp(t, slotPolicy, WithSlots(64))
		now := Now()
		for i := uint64(1); i < probeWindow; i++ {
			slotAt(tb.slots, i).key.Store(lockOf(now, dead))
		}
		lockWatch = time.Hour
		defer func() { lockWatch = LockTimeout }()
		require.True(t, tb.decideFrom(hashAt(0, 1), 1, now, false, nil).ok)
		assert.Empty(t, lockedSlots(tb), "the dead process's locks were taken over")
		n := tb.counters()
		assert.EqualValues(t, probeWindow-1, n.Recovered)
		assert.Zero(t, n.Contended)
	})
	t.Run("live", func(t *testing.T) {
		tb := openTemp(t, slotPolicy, WithSlots(64))
		now := Now()
		slotAt(tb.slots, 0).key.Store(lockOf(now, lockPID))
		for i := uint64(1); i < probeWindow; i++ {
			slotAt(tb.slots, i).key.Store(lockOf(now, dead))
		}
		start := Now()
		require.True(t, tb.decideFrom(hashAt(0, 1), 1, now, false, nil).ok, "a window of dead locks does not refuse a new key")
		assert.GreaterOrEqual(t, time.Duration(Now()-start), LockTimeout, "the live process's lock was waited on")
		assert.Empty(t, lockedSlots(tb))
		n := tb.counters()
		assert.EqualValues(t, probeWindow, n.Recovered)
		assert.Zero(t, n.Contended)
	})
}

// TestStatsTakesOverStaleLocks: Stats takes over a lock LockTimeout old in
// a window no claim visits, so Locked shows only locks that may be held.
func TestStatsTakesOverStaleLocks(t *testing.T) {
	tb := openTemp(t, slotPolicy, WithSlots(64))
	now := Now()
	slotAt(tb.slots, 3).key.Store(lockOf(now-2*int64(LockTimeout), lockPID))
	slotAt(tb.slots, 40).key.Store(lockOf(now, lockPID))
	st := tb.Stats()
	assert.Equal(t, 1, st.Locked)
	assert.EqualValues(t, 1, st.Recovered)
	assert.Zero(t, slotAt(tb.slots, 3).key.Load(), "the stale lock's slot is empty")
}

// TestImpossibleWords: words no process could have written are reset at
// the first claim that sees them and counted in Corrupt: a lock without a
// process id, a lock dated beyond MaxSkew ahead, a key outside its probe
// window; and a TAT beyond now + τ + MaxSkew becomes an empty bucket.
func TestImpossibleWords(t *testing.T) {
	tb := openTemp(t, slotPolicy, WithSlots(64))
	slotAt(tb.slots, 0).key.Store(lockOf(t0, 0))
	slotAt(tb.slots, 1).key.Store(lockOf(t0+int64(MaxSkew)+2*lockUnit, lockPID))
	slotAt(tb.slots, 2).key.Store(hashAt(40, 9)) // its window is 40..47
	g := hashAt(0, 9)                            // a live-looking key, TAT from far ahead
	slotAt(tb.slots, 3).key.Store(g)
	slotAt(tb.slots, 3).tat.Store(math.MaxInt64)
	slotAt(tb.slots, 4).key.Store(lockOf(t0+int64(MaxSkew), lockPID)) // possible: MaxSkew ahead
	require.True(t, tb.decideFrom(hashAt(0, 1), 1, t0, false, nil).ok)
	c := tb.counters()
	assert.EqualValues(t, 4, c.Corrupt)
	// The lock within MaxSkew is possible: the claim waited on it (it may
	// be a claim of the same key) until it had watched it for LockTimeout,
	// then took it over, not as damage.
	assert.EqualValues(t, 1, c.Recovered)
	assert.Empty(t, lockedSlots(tb))
	assert.Equal(t, t0+slotT*10, slotAt(tb.slots, 3).tat.Load(), "the impossible TAT is an empty bucket")
	assert.False(t, tb.decideFrom(g, 1, t0, false, nil).ok, "its owner, if it has one, waits for a token")
	assert.True(t, tb.decideFrom(g, 1, t0+slotT, false, nil).ok)
}

// TestStalledHolder: a claim that stalls while it holds a lock (after its
// lock, or after it replaced the TAT) is taken over LockTimeout later by
// another key's claim. When it wakes it changes nothing in the slot: the
// other key's bucket is exactly as that key left it, and the stalled claim
// finds another slot.
func TestStalledHolder(t *testing.T) {
	for step := 1; step <= 2; step++ {
		t.Run("step="+strconv.Itoa(step), func(t *testing.T) {
			tb := openTemp(t, slotPolicy, WithSlots(8)) // one window
			later := t0 + int64(LockTimeout)
			for i := range uint64(7) { // 7 live buckets, all full again before later+5T
				require.True(t, tb.decideFrom(hashAt(0, 100+i), 1, later, false, nil).ok)
			}
			x, y := hashAt(0, 1), hashAt(0, 2)
			var ys *slot
			testHookTakeOver = func(s *slot, n int) {
				if n != step || ys != nil {
					return
				}
				ys = s
				// While x's claim sleeps holding s, y claims LockTimeout later.
				require.True(t, tb.decideFrom(y, 5, later, false, nil).ok)
				require.Equal(t, y, s.key.Load(), "y took the stalled claim's slot")
			}
			defer func() { testHookTakeOver = nil }()
			require.True(t, tb.decideFrom(x, 1, t0, false, nil).ok)
			require.NotNil(t, ys)
			assert.Equal(t, y, ys.key.Load(), "the stalled claim did not publish over y")
			assert.Equal(t, later+5*slotT, ys.tat.Load(), "nor touched y's bucket")
			xs := tb.find(x)
			require.NotNil(t, xs)
			assert.NotSame(t, ys, xs)
			st := tb.Stats()
			assert.EqualValues(t, 1, st.Recovered)
			assert.EqualValues(t, 1, st.Evicted, "x then evicted the bucket nearest to full")
			assert.Zero(t, st.Locked)
		})
	}
}

// TestGarbageSlots: a table file with a valid header and every slot byte
// 0xff (each key word an impossible lock, each TAT -1). 20,000 calls on one
// key are held to b + elapsed/T, and with FailClosed they are not all
// denied either: nothing corrupt becomes "no limit" nor "no entry". (A
// table that took every lock word for a claim under way would give up on
// each claim in a window of them: all 20,000 allowed, or, failing closed,
// all denied.)
func TestGarbageSlots(t *testing.T) {
	p := Policy{Limit: 100, Window: time.Second, Burst: 10} // T = 10ms
	const slots, calls = 64, 20000
	for _, fc := range []bool{false, true} {
		t.Run("failClosed="+strconv.FormatBool(fc), func(t *testing.T) {
			path := filepath.Join(tmpfsDir(t), "garbage.sbt")
			tb, err := Open(path, p, WithSlots(slots))
			require.NoError(t, err)
			require.NoError(t, tb.Close())
			patch(t, path, headerSize, bytes.Repeat([]byte{0xff}, slots*slotSize))
			opts := []Option{WithSlots(slots)}
			if fc {
				opts = append(opts, WithFailMode(store.FailClosed))
			}
			tb, err = Open(path, p, opts...)
			require.NoError(t, err)
			defer tb.Close()
			s := Now()
			n := int64(0)
			for range calls {
				if tb.Allow("k") {
					n++
				}
			}
			e := Now()
			bound := p.Burst + (e-s)/int64(10*time.Millisecond)
			st := tb.Stats()
			t.Logf("%d of %d allowed in %v, bound %d; stats %+v", n, calls, time.Duration(e-s), bound, st)
			assert.LessOrEqual(t, n, bound, "garbage slots opened the limit")
			assert.Positive(t, n, "garbage slots shut the key out")
			assert.Positive(t, st.Corrupt)
			assert.Zero(t, st.Contended)
		})
	}
}

// TestFlipsUnderLoad: 4 processes spend at random on 4 keys of a 16-slot
// table for a second, while this process flips random bytes of the slots
// holding those keys (each flip one CAS, so it is known whose slot it hit).
// The bound checked, for every key and every window [s, e] of its allowed
// decisions: the tokens allowed are at most
//
//	b + (e−s)/T
//	+ (b + L/T) per flip of its key word or that lowered its TAT
//	+ b per eviction of it
//	+ b per lock taken over anywhere (Stats.Recovered)
//
// counting the events in [s, e + L], where L is how long the key's
// decisions in flight at the event had been held up since their clock read.
// A decision dated before a lowered TAT that spends after it finds the
// bucket fuller by up to that lag. A flipped key word loses the key its
// bucket, so the key's next bucket starts full while decisions that found
// the old slot before the flip still spend on it: both refill over the lag.
// (An eviction replaces the TAT under a lock, so no spend that read the old
// bucket lands after it: only the new bucket's full start, b, is lost.) A
// flip that raises a TAT only delays the key, or is an impossible TAT reset
// to an empty bucket; an impossible lock or key word is reset (Corrupt).
// (A table that kept impossible words would see the flips lock its slots
// for good, one after another, until every claim gave up and was allowed.)
func TestFlipsUnderLoad(t *testing.T) {
	p := Policy{Limit: 1000, Window: time.Second, Burst: 4} // T = 1ms
	c, err := p.canon()
	require.NoError(t, err)
	const slots, nkeys, procs = 16, 4, 4
	dur := time.Second
	path := filepath.Join(tmpfsDir(t), "flips.sbt")
	tb, err := Open(path, p, WithSlots(slots))
	require.NoError(t, err)
	defer tb.Close()
	owner := map[uint64]int{}
	for i := range nkeys {
		owner[tb.hk.hash("churn-"+strconv.Itoa(i))] = i
	}
	env := []string{pathEnv + "=" + path, policyEnv + "=" + encodePolicy(p, slots),
		durEnv + "=" + dur.String(), modeEnv + "=flat", keysEnv + "=" + strconv.Itoa(nkeys)}
	var kids []*child
	for range procs {
		kids = append(kids, startChild(t, childRoleF, env...))
	}
	for _, k := range kids {
		require.Equal(t, "ready", k.line(t))
	}
	for _, k := range kids {
		k.send(t, "go")
	}
	type event struct {
		lo, hi int64
		lag    bool // its allowance grows with the lag of decisions in flight
	}
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
	events := make([][]event, nkeys)
	var flips, keyFlips, lowered int
	for end := Now() + int64(dur); Now() < end; {
		time.Sleep(100 * time.Microsecond) // pace the flips
		var live []*slot
		for i := range uint64(slots) {
			if _, ours := owner[slotAt(tb.slots, i).key.Load()]; ours {
				live = append(live, slotAt(tb.slots, i))
			}
		}
		if len(live) == 0 {
			continue
		}
		s := live[r.IntN(len(live))]
		k := s.key.Load()
		who, ours := owner[k]
		if !ours {
			continue
		}
		b := r.IntN(16)
		x := uint64(1+r.IntN(255)) << (8 * (b % 8))
		lo := Now()
		ev := event{lo: lo}
		if b < 8 {
			if !s.key.CompareAndSwap(k, k^x) {
				continue
			}
			ev.lag = true
			keyFlips++
		} else {
			w := s.tat.Load()
			if s.key.Load() != k {
				continue
			}
			nw := int64(uint64(w) ^ x)
			if !s.tat.CompareAndSwap(w, nw) {
				continue
			}
			if nw > w {
				flips++
				continue // only delays
			}
			ev.lag = true
			lowered++
		}
		flips++
		ev.hi = Now()
		events[who] = append(events[who], ev)
	}
	all := make([][]spendRec, nkeys)
	var calls int64
	var total counts
	for _, k := range kids {
		var res churnResult
		require.NoError(t, json.Unmarshal([]byte(k.line(t)), &res))
		require.NoError(t, k.cmd.Wait())
		calls += res.Calls
		total.Allowed += res.Counts.Allowed
		total.Evicted += res.Counts.Evicted
		total.Contended += res.Counts.Contended
		total.Duplicates += res.Counts.Duplicates
		total.Recovered += res.Counts.Recovered
		total.Corrupt += res.Counts.Corrupt
		for key, recs := range res.Allowed {
			for _, x := range recs {
				all[key] = append(all[key], spendRec{x[0], x[1], x[2]})
			}
		}
		for key, at := range res.Events {
			for _, e := range at {
				events[key] = append(events[key], event{lo: e, hi: e})
			}
		}
	}
	st := tb.Stats()
	recovered := int64(total.Recovered + st.Recovered)
	t.Logf("%d calls, %d flips (%d of key words, %d lowering a TAT); children %+v", calls, flips, keyFlips, lowered, total)
	for key, recs := range all {
		// Each event's lag: how long before it the decisions of this key
		// in flight at it had read the clock.
		type timed struct {
			event
			lagNs int64
		}
		evs := make([]timed, 0, len(events[key]))
		for _, ev := range events[key] {
			var lag int64
			for _, r := range recs {
				if r.lo <= ev.hi && r.hi >= ev.lo {
					lag = max(lag, ev.hi-r.lo)
				}
			}
			evs = append(evs, timed{ev, lag})
		}
		extra := func(s, e int64) int64 {
			n := recovered * c.burst
			for _, ev := range evs {
				if ev.hi >= s && ev.lo-ev.lagNs <= e {
					n += c.burst
					if ev.lag {
						n += (ev.lagNs + c.interval - 1) / c.interval
					}
				}
			}
			return n
		}
		// The whole run first, in one pass: a table that lets far too much
		// through fails here rather than in a quadratic check.
		var sum int64
		s, e := int64(math.MaxInt64), int64(0)
		for _, r := range recs {
			sum += r.cost
			s, e = min(s, r.lo), max(e, r.hi)
		}
		require.LessOrEqual(t, sum*c.interval, c.tau()+e-s+extra(s, e)*c.interval, "key %d: %d tokens in %v", key, sum, time.Duration(e-s))
		checkBoundPlus(t, c, "churn-"+strconv.Itoa(key), recs, extra)
		t.Logf("key %d: %d allowed decisions, %d loosening events", key, len(recs), len(evs))
	}
	require.Positive(t, flips)
	assert.Zero(t, total.Contended, "no call gave up: no window stayed locked")
}
