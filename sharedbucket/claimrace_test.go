//go:build linux || darwin

package sharedbucket

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Two claims of one new key at once (the first requests for a key, from
// two processes) must never both publish it: spends on two slots of one
// key each see only their own bucket, so the key gets up to two bursts in
// an instant, and no merge afterwards can take back what was allowed.
// These tests stop one claim at a chosen step and run the other meanwhile.
// Every call is at one instant (t0), where the bound is b.

// TestClaimWaitsForStalledClaim: a claim of h stopped right after locking
// its slot (another process's, descheduled or SIGSTOPped), and another
// claim of h meanwhile. The second must not take another slot while the
// first may still publish h (it waits, then takes the lock over as
// LockTimeout old), so h gets b tokens at t0, not 2b. (Before: the second
// claim waited 32 rounds of Gosched, took the next slot and spent b on it;
// the first then published h in the earlier slot, and settling dropped the
// later slot with its spends: 20 allowed where 10 were due.)
func TestClaimWaitsForStalledClaim(t *testing.T) {
	tb := openTemp(t, slotPolicy, WithSlots(64)) // b = 10
	h := hashAt(8, 1)
	stalled := false
	meanwhile := 0
	testHookTakeOver = func(s *slot, step int) {
		if step != 1 || stalled {
			return
		}
		stalled = true
		for range 10 {
			if tb.decideFrom(h, 1, t0, false, nil).ok {
				meanwhile++
			}
		}
	}
	defer func() { testHookTakeOver = nil }()
	after := 0
	for range 10 {
		if tb.decideFrom(h, 1, t0, false, nil).ok {
			after++
		}
	}
	require.True(t, stalled)
	assert.Equal(t, 10, meanwhile+after, "h allowed %d while the first claim was stopped, %d after: the bound at one instant is b = 10", meanwhile, after)
	assert.GreaterOrEqual(t, pos(tb, h), 0, "h holds one slot")
	c := tb.counters()
	assert.EqualValues(t, 1, c.Recovered, "the stopped claim's lock was taken over")
	assert.Zero(t, c.Contended)
}

// TestClaimFindsRacingPublish: a claim of h that chose an empty slot is
// held up before locking it, while another claim of h (which saw that slot
// taken) publishes h further along and spends there. Locking the slot then
// succeeds; the claim must find h published before it publishes its own,
// and give its slot back. (Before: it published h in the earlier slot,
// settled by taking the key away from the later one, and started a fresh
// bucket: 20 allowed where 10 were due.)
func TestClaimFindsRacingPublish(t *testing.T) {
	tb := openTemp(t, slotPolicy, WithSlots(64))
	const home = 16
	h, other := hashAt(home, 1), hashAt(home, 2)
	first := slotAt(tb.slots, home)
	raced := false
	meanwhile := 0
	testHookTakeOver = func(s *slot, step int) {
		if step != 0 || raced || s != first {
			return
		}
		raced = true
		// The other claim sees the first slot held by a live bucket...
		first.key.Store(other)
		first.tat.Store(t0 + 5*slotT)
		for range 10 {
			if tb.decideFrom(h, 1, t0, false, nil).ok {
				meanwhile++
			}
		}
		require.Equal(t, 1, pos(tb, h), "the other claim took the next slot")
		// ... which is forgotten before the held-up claim locks it.
		first.tat.Store(0)
		first.key.Store(0)
	}
	defer func() { testHookTakeOver = nil }()
	after := 0
	for range 10 {
		if tb.decideFrom(h, 1, t0, false, nil).ok {
			after++
		}
	}
	require.True(t, raced)
	assert.Equal(t, 10, meanwhile+after, "h allowed %d by the other claim, %d after: the bound at one instant is b = 10", meanwhile, after)
	assert.Equal(t, 1, pos(tb, h), "h stays where it was published first")
	assert.Zero(t, first.key.Load(), "the held-up claim gave its slot back")
}

// TestRacingClaims: goroutines claim the same new keys at once, three keys
// per probe window, with claims held up at random steps (a preempted or
// descheduled claimer). Each key gets exactly b tokens at its instant.
func TestRacingClaims(t *testing.T) {
	tb := openTemp(t, slotPolicy, WithSlots(64))
	testHookTakeOver = func(*slot, int) {
		for range rand.IntN(80) {
			runtime.Gosched()
		}
	}
	defer func() { testHookTakeOver = nil }()
	const rounds, workers, keys = 60, 4, 3
	for r := range uint64(rounds) {
		// A new instant each round, every earlier bucket full again: the
		// claims reclaim slots as well as fill empty ones.
		at := t0 + int64(r)*2*tb.tau
		home := r * 8 % 64
		var allowed [keys]atomic.Int64
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for range 10 {
					for k := range uint64(keys) {
						if tb.decideFrom(hashAt(home, r<<8|k+1), 1, at, false, nil).ok {
							allowed[k].Add(1)
						}
					}
				}
			})
		}
		wg.Wait()
		for k := range keys {
			n := allowed[k].Load()
			require.LessOrEqual(t, n, int64(10), "round %d key %d: the bound at one instant is b = 10 (stats %+v)", r, k, tb.counters())
			if tb.counters().Recovered == 0 {
				// (A claim's lock taken over after LockTimeout, on a machine
				// that stops a goroutine that long, may leave its slot's
				// TAT 1 ns ahead: 9 tokens at that instant.)
				require.EqualValues(t, 10, n, "round %d key %d: b at one instant", r, k)
			}
		}
	}
}

// TestCrossProcessStalledClaim: a child process stops in the middle of its
// claim of a new key, holding its slot's lock; this process then claims the
// same key at the same instant, and the child goes on. Together they get b
// tokens, not 2b.
func TestCrossProcessStalledClaim(t *testing.T) {
	path := filepath.Join(tmpfsDir(t), "stall.sbt")
	tb, err := Open(path, slotPolicy, WithSlots(64))
	require.NoError(t, err)
	defer tb.Close()
	at := Now()
	c := startChild(t, childRoleH, pathEnv+"="+path, policyEnv+"="+encodePolicy(slotPolicy, 64),
		seedEnv+"="+strconv.FormatInt(at, 10))
	require.Equal(t, "locked", c.line(t), "the child stopped holding its claim's lock")
	parent := 0
	for range 10 {
		if tb.AllowAt("k", 1, at) {
			parent++
		}
	}
	c.send(t, "go on")
	child, err := strconv.Atoi(c.line(t))
	require.NoError(t, err)
	require.NoError(t, c.cmd.Wait())
	assert.Equal(t, 10, parent+child, "allowed %d here, %d in the child: the bound at one instant is b = 10", parent, child)
	assert.EqualValues(t, 1, tb.counters().Recovered, "the stopped child's lock was taken over")
}

// childStallClaim spends b tokens on key "k" at the time in SLUICE_SB_SEED,
// one at a time, and prints how many it got; its first claim stops once its
// slot is locked, prints "locked" and waits for a line on stdin.
func childStallClaim() error {
	p, slots := decodePolicy()
	tb, err := Open(os.Getenv(pathEnv), p, WithSlots(slots))
	if err != nil {
		return err
	}
	defer tb.Close()
	at, err := strconv.ParseInt(os.Getenv(seedEnv), 10, 64)
	if err != nil {
		return err
	}
	in := bufio.NewScanner(os.Stdin)
	stalled := false
	testHookTakeOver = func(s *slot, step int) {
		if step == 1 && !stalled {
			stalled = true
			fmt.Println("locked")
			in.Scan()
		}
	}
	n := 0
	for range p.burstOrLimit() {
		if tb.AllowAt("k", 1, at) {
			n++
		}
	}
	if !stalled {
		return fmt.Errorf("the claim never locked a slot")
	}
	fmt.Println(n)
	return nil
}
