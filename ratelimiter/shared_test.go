package ratelimiter_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/ratelimiter"
	"github.com/sluice-go/sluice/sharedbucket"
)

// The cross-process test re-executes this test binary with sharedChildEnv
// set; TestMain then runs sharedChild instead of the tests.
const (
	sharedChildEnv = "SLUICE_RATELIMITER_SHARED_CHILD" // the table's path
	sharedEndEnv   = "SLUICE_RATELIMITER_SHARED_END"   // unix ns at which to stop
	sharedKey      = "api.example.com"
)

// sharedPolicy: 50 per second, bursts of 5, for every process together.
var sharedPolicy = sharedbucket.Policy{Limit: 50, Window: time.Second, Burst: 5}

// sharedChild is one process of the cross-process test: four goroutines
// block in Acquire on a Shared limiter until the common end time, then it
// prints what it was admitted and how often the table refused it.
func sharedChild() int {
	table, err := sharedbucket.Open(os.Getenv(sharedChildEnv), sharedPolicy)
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	defer table.Close()
	l, err := ratelimiter.New(context.Background(), 1, 1, ratelimiter.Shared(table.Bucket(sharedKey)))
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	endNs, _ := strconv.ParseInt(os.Getenv(sharedEndEnv), 10, 64)
	// Stop at the common end, but run at least half a second even if this
	// process was slow to start (a loaded machine under -race): the bound
	// the parent checks spans its own measurement of the whole run anyway.
	end := time.Unix(0, endNs)
	if least := time.Now().Add(500 * time.Millisecond); end.Before(least) {
		end = least
	}
	ctx, cancel := context.WithDeadline(context.Background(), end)
	defer cancel()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for l.Acquire(ctx, 1) == nil {
				admitted.Add(1)
			}
		}()
	}
	wg.Wait()
	st := table.Stats()
	fmt.Printf("admitted %d denied %d\n", admitted.Load(), st.Denied)
	return 0
}

// TestSharedCrossProcess: three processes, each with a Shared limiter on one
// table file and four goroutines blocking in Acquire, are admitted in total
// no more than burst + rate·elapsed, where elapsed spans from before the
// first process started to after the last one ended. The head of each
// process's queue sleeps the table's RetryAfter between tries, so the
// table's refusals stay a small multiple of its grants (a busy wait would
// be refused millions of times).
func TestSharedCrossProcess(t *testing.T) {
	const procs = 3
	path := filepath.Join(t.TempDir(), "shared.bucket")
	table, err := sharedbucket.Open(path, sharedPolicy) // create it before the children attach
	require.NoError(t, err)
	defer table.Close()

	start := time.Now()
	end := start.Add(1500 * time.Millisecond)
	var cmds []*exec.Cmd
	var outs []*bufio.Scanner
	for range procs {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), sharedChildEnv+"="+path, sharedEndEnv+"="+strconv.FormatInt(end.UnixNano(), 10))
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		cmds = append(cmds, cmd)
		outs = append(outs, bufio.NewScanner(out))
	}
	var total, denied int64
	for i, cmd := range cmds {
		var a, d int64
		require.True(t, outs[i].Scan(), "child %d printed nothing", i)
		_, err := fmt.Sscanf(outs[i].Text(), "admitted %d denied %d", &a, &d)
		require.NoError(t, err, "child %d said %q", i, outs[i].Text())
		require.NoError(t, cmd.Wait())
		t.Logf("process %d: admitted %d, table refusals %d", i, a, d)
		total += a
		denied += d
	}
	elapsed := time.Since(start)
	rate := float64(sharedPolicy.Limit) / sharedPolicy.Window.Seconds()
	bound := float64(sharedPolicy.Burst) + rate*elapsed.Seconds()
	t.Logf("total admitted %d in %v; bound %.1f; refusals %d", total, elapsed, bound, denied)
	assert.LessOrEqual(t, float64(total), bound)
	assert.GreaterOrEqual(t, float64(total), rate*0.5, "the processes were starved")
	assert.LessOrEqual(t, denied, 10*total+100, "refusals suggest a busy wait")
}

// TestSharedInProcess: two limiters on one table in one process: the total
// holds to the table's bound, local waiters are served FIFO, a request above
// the table's burst fails at once, and the accessors report the table's
// policy.
func TestSharedInProcess(t *testing.T) {
	table, err := sharedbucket.Open(filepath.Join(t.TempDir(), "t.bucket"), sharedPolicy)
	require.NoError(t, err)
	defer table.Close()
	start := time.Now()
	a, err := ratelimiter.New(context.Background(), 1, 1, ratelimiter.Shared(table.Bucket("k")))
	require.NoError(t, err)
	b, err := ratelimiter.New(context.Background(), 1, 1, ratelimiter.Shared(table.Bucket("k")))
	require.NoError(t, err)
	assert.Equal(t, 50.0, a.Rate())
	assert.Equal(t, 5, a.Burst())
	assert.InDelta(t, 5.0, a.Tokens(), 0.01, "a fresh key is full")
	err = a.Acquire(context.Background(), 6)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "n=6")

	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for _, l := range []*ratelimiter.Limiter{a, b, a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for l.Acquire(ctx, 1) == nil {
				admitted.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	// The table's bound, with the allowance its package doc gives each
	// counted event that loosens it. (Two limiters asking for a new key at
	// once, one held up mid-claim, are not one: the key never gets two
	// buckets.)
	st := table.Stats()
	events := st.Evicted + st.Recovered
	bound := 5 + 50*elapsed.Seconds() + 5*float64(events) + float64(st.Contended)
	assert.LessOrEqual(t, float64(admitted.Load()), bound, "stats %+v", st)
	assert.Greater(t, admitted.Load(), int64(5))
	assert.Equal(t, 0, a.Waiters())
	assert.Equal(t, 0, b.Waiters())

	// Stop releases a parked shared waiter.
	for a.TryAcquire(1) {
	}
	errc := make(chan error, 1)
	go func() { errc <- a.Acquire(context.Background(), 5) }()
	waitFor(t, "the waiter to park", func() bool { return a.Waiters() == 1 })
	assert.True(t, a.Stop())
	assert.ErrorIs(t, <-errc, ratelimiter.ErrStopped)
}

func TestSharedInvalid(t *testing.T) {
	_, err := ratelimiter.New(context.Background(), 1, 1, ratelimiter.Shared(nil))
	assert.Error(t, err)
	table, err := sharedbucket.Open(filepath.Join(t.TempDir(), "t.bucket"), sharedPolicy)
	require.NoError(t, err)
	defer table.Close()
	_, err = ratelimiter.New(context.Background(), 1, 1, ratelimiter.Shared(table.Bucket("")))
	assert.Error(t, err)

	// The table's policy is the limit: a Shared limiter's rate and burst
	// cannot be changed on their own.
	l, err := ratelimiter.New(context.Background(), 1, 1, ratelimiter.Shared(table.Bucket("k")))
	require.NoError(t, err)
	err = l.SetRate(10)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "SetRate(10)")
	err = l.SetBurst(3)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "SetBurst(3)")
	assert.Equal(t, 50.0, l.Rate())
	assert.Equal(t, 5, l.Burst())
}
