//go:build linux || darwin

package sharedbucket

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Cross-process tests re-execute this test binary with childEnv set to a
// role; TestMain runs the role instead of the tests. Parameters travel in
// environment variables, results come back as lines on stdout.
const (
	childEnv   = "SLUICE_SHAREDBUCKET_CHILD"
	pathEnv    = "SLUICE_SB_PATH"
	policyEnv  = "SLUICE_SB_POLICY" // limit,window-ns,burst,slots
	roundsEnv  = "SLUICE_SB_ROUNDS"
	durEnv     = "SLUICE_SB_DURATION"
	modeEnv    = "SLUICE_SB_MODE"
	keysEnv    = "SLUICE_SB_KEYS"
	seedEnv    = "SLUICE_SB_SEED"
	childRoleA = "open-rounds"
	childRoleB = "stall-create"
	childRoleC = "hammer"
	childRoleD = "exact"
	childRoleE = "clock"
	childRoleF = "churn"
	childRoleG = "claim"
	childRoleH = "stall-claim"
)

func encodePolicy(p Policy, slots int) string {
	return fmt.Sprintf("%d,%d,%d,%d", p.Limit, int64(p.Window), p.Burst, slots)
}

func decodePolicy() (Policy, int) {
	var p Policy
	var w int64
	var slots int
	fmt.Sscanf(os.Getenv(policyEnv), "%d,%d,%d,%d", &p.Limit, &w, &p.Burst, &slots)
	p.Window = time.Duration(w)
	return p, slots
}

// runChild runs one child role and returns its exit code.
func runChild(role string) int {
	var err error
	switch role {
	case childRoleA:
		err = childOpenRounds()
	case childRoleB:
		err = childStallCreate()
	case childRoleC:
		err = childHammer()
	case childRoleD:
		err = childExact()
	case childRoleE:
		fmt.Println(Now())
	case childRoleF:
		err = childChurn()
	case childRoleG:
		err = childClaim()
	case childRoleH:
		err = childStallClaim()
	default:
		err = fmt.Errorf("unknown child role %q", role)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

// childOpenRounds: for each round, wait for "go" on stdin, open
// <path>.<round>, print the creation nonce, close.
func childOpenRounds() error {
	p, slots := decodePolicy()
	rounds, _ := strconv.Atoi(os.Getenv(roundsEnv))
	in := bufio.NewScanner(os.Stdin)
	fmt.Println("ready")
	for r := range rounds {
		if !in.Scan() {
			return fmt.Errorf("stdin closed before round %d", r)
		}
		tb, err := Open(fmt.Sprintf("%s.%d", os.Getenv(pathEnv), r), p, WithSlots(slots))
		if err != nil {
			return err
		}
		fmt.Println(hex.EncodeToString(tb.nonce[:]))
		tb.Close()
	}
	return nil
}

// childStallCreate builds the file and stops for ever just before
// publishing it, so the parent can kill a creator mid-creation.
func childStallCreate() error {
	p, slots := decodePolicy()
	testHookBeforePublish = func(tmp string) {
		fmt.Println("ready", tmp)
		select {}
	}
	_, err := Open(os.Getenv(pathEnv), p, WithSlots(slots))
	return err
}

// childHammer spends on many keys (claims, reclaims, evictions) and one hot
// Bucket until it is killed.
func childHammer() error {
	p, slots := decodePolicy()
	tb, err := Open(os.Getenv(pathEnv), p, WithSlots(slots))
	if err != nil {
		return err
	}
	nkeys, _ := strconv.Atoi(os.Getenv(keysEnv))
	seed, _ := strconv.ParseUint(os.Getenv(seedEnv), 10, 64)
	r := rand.New(rand.NewPCG(seed, 1))
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = "h" + strconv.Itoa(i)
	}
	hot := tb.Bucket("hot")
	fmt.Println("ready")
	for i := 0; ; i++ {
		if i%4 == 0 {
			hot.AllowN(1)
		} else {
			tb.AllowN(keys[r.IntN(nkeys)], 1+r.Int64N(p.burstOrLimit()))
		}
		if i%997 == 0 {
			tb.Forget(keys[r.IntN(nkeys)])
		}
	}
}

// exactResult is what an exact child reports.
type exactResult struct {
	Allowed int64 `json:"allowed"`
	Calls   int64 `json:"calls"`
	First   int64 `json:"first"` // clock reading at or before the first decision
	Last    int64 `json:"last"`  // clock reading at or after the last decision
	// FirstDone is a reading taken when the first call had returned: the
	// first decision's CAS landed in [First, FirstDone].
	FirstDone int64 `json:"first_done"`
	// Idle is, summed over this process's allowed calls, how long the bucket
	// had been full when the call came (now − TAT read just before it, when
	// positive): time in which tokens came back that nobody could take. It
	// over-counts when another process spends between that read and the
	// call, which only makes the liveness check looser.
	Idle int64 `json:"idle"`
}

// childExact waits for "go" on stdin, then spends one token at a time on
// one key for the given duration and reports. Mode "at" passes its own
// clock readings (exact decision times); mode "live" lets the table read
// the clock and brackets each call with its own readings; mode "coarse" is
// "live" with WithCoarseClock, bracketed by the coarse clock.
func childExact() error {
	p, slots := decodePolicy()
	mode := os.Getenv(modeEnv)
	opts := []Option{WithSlots(slots)}
	if mode == "coarse" {
		opts = append(opts, WithCoarseClock(100*time.Microsecond))
	}
	tb, err := Open(os.Getenv(pathEnv), p, opts...)
	if err != nil {
		return err
	}
	defer tb.Close()
	dur, _ := time.ParseDuration(os.Getenv(durEnv))
	// In mode "coarse" the table's own (coarse) clock dates the decisions,
	// so the child brackets its calls with that clock.
	live := mode == "live" || mode == "coarse"
	clock := Now
	if mode == "coarse" {
		clock = tb.now
	}
	bk := tb.Bucket("exact")
	// Fault the mapping's pages in now (a write to another key), so that the
	// first timed call does not sit on a page fault while the bucket is full.
	tb.AllowAt("warm-up", 1, Now())
	in := bufio.NewScanner(os.Stdin)
	fmt.Println("ready")
	if !in.Scan() {
		return fmt.Errorf("stdin closed")
	}
	var res exactResult
	start := clock()
	end := start + int64(dur)
	res.First = -1
	for {
		var tatBefore int64 = -1
		if s := tb.find(bk.h); s != nil {
			tatBefore = s.tat.Load()
		}
		var now int64
		var ok bool
		if live {
			ok = tb.Allow("exact")
			now = clock() // at or after the decision
		} else {
			now = Now()
			ok = bk.AllowAt(1, now)
		}
		if res.First < 0 {
			// The first decision time: exact in mode "at"; in the live
			// modes a reading taken before the call.
			res.First = now
			if live {
				res.First = start
			}
			res.FirstDone = clock()
		}
		res.Calls++
		if ok {
			res.Allowed++
			// tatBefore ≤ 0: no slot or no spend yet, this is the key's
			// first spend (the full stretch before it is the parent's
			// startLag).
			if tatBefore > 0 && now > tatBefore {
				res.Idle += now - tatBefore
			}
		}
		res.Last = now
		if now >= end {
			break
		}
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// child is a running child process with line access to its stdout.
type child struct {
	cmd   *exec.Cmd
	out   *bufio.Scanner
	stdin interface {
		Write([]byte) (int, error)
		Close() error
	}
}

func startChild(t *testing.T, role string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{childEnv + "=" + role}, env...)...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, out: bufio.NewScanner(stdout), stdin: stdin}
	c.out.Buffer(nil, 256<<20) // a report of every allowed decision is one line
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return c
}

// line returns the child's next stdout line.
func (c *child) line(t *testing.T) string {
	t.Helper()
	if !c.out.Scan() {
		t.Fatalf("child %d: stdout ended (%v)", c.cmd.Process.Pid, c.out.Err())
	}
	return strings.TrimSpace(c.out.Text())
}

func (c *child) send(t *testing.T, s string) {
	t.Helper()
	if _, err := c.stdin.Write([]byte(s + "\n")); err != nil {
		t.Fatal(err)
	}
}

// churnResult is what a churn child reports: per key, its allowed
// decisions, and the keys it saw evicted (the counted events that loosen
// the bound).
type churnResult struct {
	Allowed  [][][3]int64 `json:"allowed"` // per key: {lo, hi, cost}
	Excluded []int        `json:"excluded"`
	Events   [][]int64    `json:"events"` // per key: when it was evicted
	Calls    int64        `json:"calls"`
	Counts   counts       `json:"counts"`
}

// churnKeys is the key set of the churn role: twice as many keys as slots.
const churnKeys = 16

// childChurn waits for "go", then for the given duration spends on keys
// chosen by the time (two per τ-long epoch, so slots keep changing hands)
// and reports. Mode "at" passes times up to SLUICE_SB_SEED ns behind its
// clock reading (a stale-dated or preempted caller); mode "live" lets the
// table read the clock and brackets each call with its own readings; mode
// "flat" is "live" on keys chosen at random. SLUICE_SB_KEYS, if set, is the
// number of keys (default churnKeys).
func childChurn() error {
	p, slots := decodePolicy()
	c, err := p.canon()
	if err != nil {
		return err
	}
	tb, err := Open(os.Getenv(pathEnv), p, WithSlots(slots))
	if err != nil {
		return err
	}
	defer tb.Close()
	dur, _ := time.ParseDuration(os.Getenv(durEnv))
	skew, _ := strconv.ParseInt(os.Getenv(seedEnv), 10, 64)
	mode := os.Getenv(modeEnv)
	live := mode == "live" || mode == "flat"
	nkeys := churnKeys
	if n, err := strconv.Atoi(os.Getenv(keysEnv)); err == nil {
		nkeys = n
	}
	names := make([]string, nkeys)
	index := map[uint64]int{}
	for i := range names {
		names[i] = "churn-" + strconv.Itoa(i)
		index[tb.hk.hash(names[i])] = i
	}
	excluded := map[int]bool{}
	res := churnResult{Allowed: make([][][3]int64, nkeys), Events: make([][]int64, nkeys)}
	var mu sync.Mutex
	mark := func(h uint64) {
		if k, ok := index[h]; ok {
			mu.Lock()
			excluded[k] = true
			res.Events[k] = append(res.Events[k], Now())
			mu.Unlock()
		}
	}
	testHookEvict = mark
	r := rand.New(rand.NewPCG(uint64(os.Getpid()), 5))
	in := bufio.NewScanner(os.Stdin)
	fmt.Println("ready")
	if !in.Scan() {
		return fmt.Errorf("stdin closed")
	}
	for end := Now() + int64(dur); ; {
		lo := Now()
		if lo >= end {
			break
		}
		at := lo
		if !live {
			at -= r.Int64N(skew + 1)
		}
		// Two keys per τ-long epoch, one shared with the next epoch, so a
		// few keys are live at once and slots change hands rather than
		// being evicted.
		k := int(at/c.tau()+r.Int64N(2)) % nkeys
		if mode == "flat" {
			k = r.IntN(nkeys)
		}
		cost := 1 + r.Int64N(c.burst)
		var ok bool
		hi := at
		if live {
			ok = tb.AllowN(names[k], cost)
			at, hi = lo, Now()
		} else {
			ok = tb.AllowAt(names[k], cost, at)
		}
		res.Calls++
		if ok {
			res.Allowed[k] = append(res.Allowed[k], [3]int64{at, hi, cost})
		}
	}
	for k := range excluded {
		res.Excluded = append(res.Excluded, k)
	}
	res.Counts = tb.counters()
	return json.NewEncoder(os.Stdout).Encode(res)
}

// childClaim spends one token on a new key on every call, from two
// goroutines (keys seen about once, like client IPs: every call claims a
// slot), until it is killed.
func childClaim() error {
	p, slots := decodePolicy()
	tb, err := Open(os.Getenv(pathEnv), p, WithSlots(slots))
	if err != nil {
		return err
	}
	prefix := "ip-" + strconv.Itoa(os.Getpid()) + "-"
	var n atomic.Int64
	for range 2 {
		go func() {
			for {
				tb.Allow(prefix + strconv.FormatInt(n.Add(1), 10))
			}
		}()
	}
	fmt.Println("ready")
	select {}
}
