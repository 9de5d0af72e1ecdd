//go:build linux || darwin

package sharedbucket

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestChildClockAgrees: a child process's Now lies inside the parent's
// bracket, and Now agrees with clock_gettime of the host's monotonic clock
// (CLOCK_MONOTONIC on Linux, CLOCK_UPTIME_RAW on macOS): the clock is
// absolute, not process-relative.
func TestChildClockAgrees(t *testing.T) {
	for range 1 {
		before := Now()
		c := startChild(t, childRoleE)
		v, err := strconv.ParseInt(c.line(t), 10, 64)
		require.NoError(t, err)
		require.NoError(t, c.cmd.Wait())
		after := Now()
		assert.True(t, before <= v && v <= after, "child %d not in [%d, %d]", v, before, after)
	}
	var ts unix.Timespec
	a := Now()
	require.NoError(t, unix.ClockGettime(nowClockID, &ts))
	b := Now()
	assert.True(t, a <= ts.Nano() && ts.Nano() <= b, "CLOCK_MONOTONIC %d not in [%d, %d]", ts.Nano(), a, b)
}

// TestCreationRace: 8 processes open the same new path at once, 10 times
// over. Each round, all of them see one file (one creation nonce) and no
// temporary file is left behind.
func TestCreationRace(t *testing.T) {
	const procs, rounds = 8, 10
	dir := tmpfsDir(t)
	base := filepath.Join(dir, "race.sbt")
	var kids []*child
	for range procs {
		kids = append(kids, startChild(t, childRoleA,
			pathEnv+"="+base, policyEnv+"="+encodePolicy(fileP, 64), roundsEnv+"="+strconv.Itoa(rounds)))
	}
	for _, c := range kids {
		require.Equal(t, "ready", c.line(t))
	}
	for r := range rounds {
		for _, c := range kids {
			c.send(t, "go")
		}
		nonces := map[string]int{}
		for _, c := range kids {
			nonces[c.line(t)]++
		}
		require.Len(t, nonces, 1, "round %d: processes disagree on the file: %v", r, nonces)
	}
	for _, c := range kids {
		require.NoError(t, c.cmd.Wait())
	}
	var want []string
	for r := range rounds {
		want = append(want, fmt.Sprintf("race.sbt.%d", r))
	}
	assert.ElementsMatch(t, want, entries(t, dir), "one file per round and nothing else")
}

// TestCreatorKilled: a creator SIGKILLed after building its file but before
// publishing it leaves no file under the final name; the next opener creates
// the table and removes the dead creator's temporary file.
func TestCreatorKilled(t *testing.T) {
	dir := tmpfsDir(t)
	path := filepath.Join(dir, "k.sbt")
	c := startChild(t, childRoleB, pathEnv+"="+path, policyEnv+"="+encodePolicy(fileP, 64))
	f := strings.Fields(c.line(t))
	require.Len(t, f, 2)
	require.Equal(t, "ready", f[0])
	tmp := f[1]
	require.FileExists(t, tmp)
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGKILL))
	_ = c.cmd.Wait()

	_, err := os.Lstat(path)
	require.True(t, os.IsNotExist(err), "nothing published under the final name")
	tb, err := Open(path, fileP, WithSlots(64))
	require.NoError(t, err, "nothing wedges the next opener")
	defer tb.Close()
	assert.True(t, tb.Allow("k"))
	assert.Equal(t, []string{"k.sbt"}, entries(t, dir), "the dead creator's temporary file was swept")
}

// TestKillStorm: processes hammer a small table (claims, reclaims,
// evictions, forgets) while being SIGKILLed and SIGSTOPped at random. After
// the storm the file validates, every TAT is within now+τ, no key holds two
// live slots, every bucket is full τ later, and the table keeps working.
func TestKillStorm(t *testing.T) {
	p := Policy{Limit: 1000, Window: time.Second, Burst: 10} // τ = 10ms
	const slots, nkeys, procs = 64, 96, 3
	path := filepath.Join(tmpfsDir(t), "storm.sbt")
	tb, err := Open(path, p, WithSlots(slots))
	require.NoError(t, err)
	defer tb.Close()
	env := []string{pathEnv + "=" + path, policyEnv + "=" + encodePolicy(p, slots), keysEnv + "=" + strconv.Itoa(nkeys)}
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	spawn := func() *child {
		c := startChild(t, childRoleC, append(env, seedEnv+"="+strconv.FormatUint(r.Uint64(), 10))...)
		require.Equal(t, "ready", c.line(t))
		return c
	}
	kids := make([]*child, procs)
	for i := range kids {
		kids[i] = spawn()
	}
	// The parent hammers too, and must keep getting answers throughout.
	stop := make(chan struct{})
	progress := make(chan int64)
	go func() {
		var n int64
		bk := tb.Bucket("parent")
		for {
			select {
			case <-stop:
				progress <- n
				return
			default:
			}
			if bk.AllowN(1) {
				n++
			}
			tb.Allow("h" + strconv.Itoa(int(n%nkeys)))
		}
	}()
	kills, stops := 0, 0
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		// Let the children run for a random 1–100 ms between blows.
		time.Sleep(time.Duration(1+r.IntN(100)) * time.Millisecond)
		i := r.IntN(procs)
		if r.IntN(3) == 0 {
			// A long pause, possibly between a Load and its CAS.
			require.NoError(t, kids[i].cmd.Process.Signal(syscall.SIGSTOP))
			time.Sleep(time.Duration(1+r.IntN(30)) * time.Millisecond)
			require.NoError(t, kids[i].cmd.Process.Signal(syscall.SIGCONT))
			stops++
			continue
		}
		require.NoError(t, kids[i].cmd.Process.Signal(syscall.SIGKILL))
		_ = kids[i].cmd.Wait()
		kids[i] = spawn()
		kills++
	}
	for _, c := range kids {
		c.cmd.Process.Signal(syscall.SIGKILL)
		_ = c.cmd.Wait()
	}
	close(stop)
	parentAllowed := <-progress
	t.Logf("%d kills, %d stop/cont pauses; parent allowed %d; stats %+v", kills, stops, parentAllowed, tb.Stats())
	require.Greater(t, parentAllowed, int64(0))

	// The file validates on a fresh attach.
	again, err := Open(path, p, WithSlots(slots))
	require.NoError(t, err)
	defer again.Close()
	now := Now()
	live := map[uint64]int{}
	for i := range uint64(slots) {
		s := slotAt(again.slots, i)
		tat, key := s.tat.Load(), s.key.Load()
		require.LessOrEqual(t, tat, now+again.tau, "slot %d: TAT beyond now+τ", i)
		if key != 0 && tat > now {
			live[key]++
		}
	}
	for k, n := range live {
		assert.Equal(t, 1, n, "key %x holds %d live slots", k, n)
	}
	later := now + again.tau
	for i := range nkeys {
		k := "h" + strconv.Itoa(i)
		assert.Equal(t, 10.0, again.RemainingAt(k, later), "key %s full τ later", k)
	}
	assert.Equal(t, 10.0, again.RemainingAt("hot", later))
	// And it still limits exactly.
	n := 0
	for range 20 {
		if again.AllowAt("after-storm", 1, later) {
			n++
		}
	}
	assert.Equal(t, 10, n)
}

// TestCrossProcessExact: P processes spend on one key for about a second.
// The total allowed never exceeds b + (e−s)/T, with no slack at all, and
// (counting the tokens still in the bucket at e) is at least that bound − P,
// less the tokens that came back while the bucket sat full because no
// process was running (the machine is shared; the children measure that
// time, and on a quiet machine it is 0).
func TestCrossProcessExact(t *testing.T) {
	dur := time.Second
	for _, tc := range []struct {
		p     Policy
		procs int
		mode  string
	}{
		{Policy{Limit: 100_000, Window: time.Second, Burst: 100}, 2, "at"},
		{Policy{Limit: 100_000, Window: time.Second, Burst: 100}, 4, "at"},
		{Policy{Limit: 1000, Window: time.Second, Burst: 10}, 2, "at"},
		{Policy{Limit: 1000, Window: time.Second, Burst: 10}, 4, "at"},
		{Policy{Limit: 5, Window: 300 * time.Second, Burst: 5}, 2, "at"},
		{Policy{Limit: 5, Window: 300 * time.Second, Burst: 5}, 4, "at"},
		{Policy{Limit: 100_000, Window: time.Second, Burst: 100}, 2, "live"},
		{Policy{Limit: 1000, Window: time.Second, Burst: 10}, 4, "live"},
		{Policy{Limit: 100_000, Window: time.Second, Burst: 100}, 2, "coarse"},
	} {
		name := fmt.Sprintf("%d per %v b=%d P=%d %s", tc.p.Limit, tc.p.Window, tc.p.Burst, tc.procs, tc.mode)
		t.Run(name, func(t *testing.T) {
			c, err := tc.p.canon()
			require.NoError(t, err)
			path := filepath.Join(tmpfsDir(t), "exact.sbt")
			env := []string{pathEnv + "=" + path, policyEnv + "=" + encodePolicy(tc.p, 64),
				durEnv + "=" + dur.String(), modeEnv + "=" + tc.mode}
			var kids []*child
			for range tc.procs {
				kids = append(kids, startChild(t, childRoleD, env...))
			}
			for _, k := range kids {
				require.Equal(t, "ready", k.line(t))
			}
			for _, k := range kids {
				k.send(t, "go")
			}
			var res []exactResult
			for _, k := range kids {
				var r exactResult
				require.NoError(t, json.Unmarshal([]byte(k.line(t)), &r))
				require.NoError(t, k.cmd.Wait())
				res = append(res, r)
			}
			var allowed, calls, idle int64
			s, e := res[0].First, res[0].Last
			startLag := res[0].FirstDone - res[0].First
			for _, r := range res {
				allowed += r.Allowed
				calls += r.Calls
				idle += r.Idle
				if r.First < s {
					s, startLag = r.First, r.FirstDone-r.First
				}
				e = max(e, r.Last)
			}
			bound := c.burst + (e-s)/c.interval
			// Every token is accounted for: allowed + left(e) = b + (e − s0
			// − idle)/T, where s0 (the first CAS's time) is at most startLag
			// after s and idle is the time the bucket sat full while no
			// process came (measured by the children; on a quiet machine 0).
			// Tokens still in the bucket at e are not lost, just not taken.
			tb, err := Open(path, tc.p, WithSlots(64))
			require.NoError(t, err)
			left := int64(tb.RemainingAt("exact", e))
			require.NoError(t, tb.Close())
			lost := (idle+startLag)/c.interval + 1
			t.Logf("calls %d, allowed %d, bound %d (e−s = %v), left at e %d, first call %v, idle %v: up to %d tokens lost",
				calls, allowed, bound, time.Duration(e-s), left, time.Duration(startLag), time.Duration(idle), lost)
			assert.LessOrEqual(t, allowed, bound, "allowed above b + (e−s)/T")
			// Liveness: on a quiet machine allowed+left reaches bound−P−lost
			// exactly (logged above). The children cannot measure every
			// preemption (one between a clock read and its CAS spends a stale
			// instant; the coarse clock's ticker can be starved), and on a
			// loaded 2-core box those cost up to a third of the tokens, so the
			// assertion asks for half: enough to fail a table that denies
			// wrongly, never a scheduler's hiccup. The upper bound above is
			// exact whatever the load.
			assert.GreaterOrEqual(t, 2*(allowed+left), bound-int64(tc.procs)-lost, "liveness")
		})
	}
}

// TestCrossProcessChurn: processes spend on twice as many keys as the
// table has slots, so buckets change slots all the time (reclaims, and the
// floors that carry a lost bucket's debt), with explicit times up to τ
// stale and with the live clock. Every key that was never evicted keeps
// the bound exactly (racing claims of one key included).
func TestCrossProcessChurn(t *testing.T) {
	p := Policy{Limit: 1000, Window: time.Second, Burst: 2} // T = 1ms, τ = 2ms
	c, err := p.canon()
	require.NoError(t, err)
	for _, mode := range []string{"at", "live"} {
		t.Run(mode, func(t *testing.T) {
			path := filepath.Join(tmpfsDir(t), "churn.sbt")
			env := []string{pathEnv + "=" + path, policyEnv + "=" + encodePolicy(p, 8),
				durEnv + "=400ms", modeEnv + "=" + mode, seedEnv + "=" + strconv.FormatInt(c.tau(), 10)}
			var kids []*child
			for range 3 {
				kids = append(kids, startChild(t, childRoleF, env...))
			}
			for _, k := range kids {
				require.Equal(t, "ready", k.line(t))
			}
			for _, k := range kids {
				k.send(t, "go")
			}
			all := make([][]spendRec, churnKeys)
			excluded := map[int]bool{}
			var calls int64
			for _, k := range kids {
				var r churnResult
				require.NoError(t, json.Unmarshal([]byte(k.line(t)), &r))
				require.NoError(t, k.cmd.Wait())
				calls += r.Calls
				t.Logf("child: %+v", r.Counts)
				for key, recs := range r.Allowed {
					for _, x := range recs {
						all[key] = append(all[key], spendRec{x[0], x[1], x[2]})
					}
				}
				for _, key := range r.Excluded {
					excluded[key] = true
				}
			}
			checked, allowed := 0, 0
			for key, recs := range all {
				if excluded[key] {
					continue
				}
				checkBound(t, c, "churn-"+strconv.Itoa(key), recs)
				checked++
				allowed += len(recs)
			}
			t.Logf("%d calls, %d keys checked (%d allowed decisions), %d evicted", calls, checked, allowed, len(excluded))
			require.GreaterOrEqual(t, checked, 2, "the exact check must have keys to check")
		})
	}
}
