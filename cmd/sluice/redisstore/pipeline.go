package redisstore

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Decisions in flight at once share round trips: each Allow queues its
// request, and a flusher sends everything queued as one pipelined write,
// in as few script calls as Redis allows (see exec), and hands each caller
// its own reply. Why: a Redis decision costs little inside Redis; what
// costs is a round trip and, on both sides, a read and a write system call
// per command, and in Redis a script call's own overhead. One pipeline of
// n requests pays those once, so the cost per decision falls as
// concurrency rises, and a lone caller pays what a plain call pays.
//
// Who flushes: a caller that finds no round trip in flight sends its call
// itself, with its own context, as a plain call would (no hand-off to
// another goroutine, which is what a lone caller's latency is made of). A
// caller that finds one in flight queues its call, and whoever ends that
// round trip sends the queue next; only when shareMin calls are queued
// does a second round trip start at once. Either way, a goroutine sends
// batches until the queue is empty; its pipelines carry no caller's
// context, and each caller waits for its reply or its own context,
// whichever comes first, or on a store from Open or OpenCluster for the
// store's timeout from the call's start (see watch), so that a caller
// queued behind a stalled round trip is not held for that one's timeout
// and then its own.

// maxFlushers bounds the pipelines in flight at once, each on its own
// connection. Two keep Redis busy while the client side encodes the next
// batch and decodes the last; more only split the batches smaller.
const maxFlushers = 2

// shareMin is the queue length at which a call that finds a round trip in
// flight starts a second one rather than leaving its call queued for the
// first's flusher. Why wait: the client's CPU per decision is mostly
// system calls and goroutine wakeups per round trip (profiled: a write, a
// read, a poll and go-redis's connection check), so it falls as batches
// grow. Starting a round trip whenever a flusher slot is free sends calls
// alone or nearly; queued behind the round trip in flight, 16 goroutines
// calling without pause make at least 8 calls a round trip
// (TestRedisConcurrentCallsRarelyGoAlone asserts it). Why a second at
// all: once a batch's worth is waiting, a second connection keeps Redis
// busy while the first's replies are decoded.
const shareMin = 16

// maxBatch bounds one pipeline, so one write stays a few tens of kilobytes.
const maxBatch = 512

// call is one decision waiting for its reply.
type call struct {
	keys     []string
	inc, tau int64 // the request: cost·T and burst·T, in ns (see gcra.lua)
	args     []any // inc and tau for go-redis (see goArgs)
	// inc and tau as rueidis takes them, and the figures they were
	// formatted from (see strs); a pooled call mostly serves the same
	// policy again.
	str   [2]string
	strOf [2]int64
	v     int64 // the script's reply
	err   error
	// done receives once per use: when v and err are set (state answered)
	// or when the call's bound has passed (state expired), whichever wins
	// state's CAS from waiting.
	done  chan struct{}
	state atomic.Uint32
	// seq counts the call's uses (it is pooled), so that an entry of
	// pipeline.waits names one use; guarded by the pipeline's mu.
	seq uint64
}

// A call's states.
const (
	waiting  = iota // sent or queued, no reply yet
	answered        // v and err are set
	expired         // the bound passed first; v and err may still be set later
)

// finish marks c answered and wakes its caller, unless its bound passed
// first (then nobody reads v and err). Call it after setting them.
func (c *call) finish() {
	if c.state.CompareAndSwap(waiting, answered) {
		c.done <- struct{}{}
	}
}

var callPool = sync.Pool{New: func() any {
	return &call{keys: make([]string, 1), args: make([]any, 2), done: make(chan struct{}, 1)}
}}

// pipeline is a store's queue of calls and its flushers. The zero value
// bounds no call; init sets a bound.
type pipeline struct {
	mu       sync.Mutex
	queue    []*call // calls not yet sent, oldest first; guarded by mu
	spare    []*call // an emptied queue slice to reuse; guarded by mu
	flushers int     // flushers running; guarded by mu
	yielding int     // flushers yielding before their next batch (see done); guarded by mu

	// The bound on each call (see watch); zero: none.
	timeout time.Duration
	late    error       // what a call whose bound passed returns
	timer   *time.Timer // fires expire at the oldest watched call's deadline
	waits   []wait      // watched calls, oldest (so earliest deadline) first; guarded by mu
	head    int         // waits[:head] are gone; guarded by mu
	armed   bool        // timer is set (or running expire); guarded by mu
	stopped bool        // stop was called: the timer is not set again; guarded by mu
}

// init makes p bound each call by timeout (≤ 0: no bound). Call it before
// the first do.
func (p *pipeline) init(timeout time.Duration) {
	if timeout <= 0 {
		return
	}
	p.timeout = timeout
	p.late = fmt.Errorf("no reply within %v: %w", timeout, context.DeadlineExceeded)
	p.timer = time.AfterFunc(time.Hour, p.expire)
	p.timer.Stop()
}

// stop stops p's timer for good (Close): calls still waiting then end
// with the closed client's error.
func (p *pipeline) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = true
	if p.timer != nil {
		p.timer.Stop()
	}
}

// do sends c on client (with the other calls in flight) and waits for its
// reply, for ctx to end, or for p's bound to pass. It returns nil when c
// was answered, else why not (ctx's error or p.late); then the caller must
// not reuse c, which a flusher may still write.
//
// How the bound holds: a call sent alone goes out on its caller's
// goroutine under a context with the bound's deadline (go-redis needs one
// to cut its dial, write and read short); a call that waits on a shared
// round trip is watched (see watch and expire), one timer for all of them.
func (p *pipeline) do(ctx context.Context, client func() *conn, c *call) error {
	p.send(ctx, client, c)
	select {
	case <-c.done:
		if c.state.Load() == expired {
			return p.late
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// send queues cs, one caller's calls, and sends them: on the caller's
// goroutine, under a context with the bound's deadline, when no round trip
// is in flight and they make a batch of their own; else with the calls
// queued around them, on a flusher's goroutine, each watched for the
// bound. It returns once they are sent or queued, not answered.
func (p *pipeline) send(ctx context.Context, client func() *conn, cs ...*call) {
	p.mu.Lock()
	for _, c := range cs {
		// Why here, under mu: a use starts with a new seq and the state
		// waiting together, so that expire, which reads both under mu,
		// never takes an entry of an earlier use for this one.
		c.seq++
		c.state.Store(waiting)
	}
	p.queue = append(p.queue, cs...)
	var batch []*call
	if p.flushers == 0 || p.flushers < maxFlushers && p.yielding == 0 && len(p.queue) >= shareMin {
		p.flushers++
		batch = p.take()
	}
	// The queue is first in, first out: a batch that starts with cs[0] and
	// is as long as cs is cs.
	own := len(batch) == len(cs) && batch[0] == cs[0]
	if !own && p.timeout > 0 {
		for _, c := range cs {
			p.watch(c)
		}
	}
	p.mu.Unlock()
	switch {
	case own:
		if p.timeout > 0 {
			bctx, cancel := context.WithTimeout(ctx, p.timeout)
			exec(bctx, client(), batch)
			cancel()
		} else {
			exec(ctx, client(), batch)
		}
		if p.done(batch, false) {
			go p.drain(client)
		}
	case len(batch) > 0:
		go func() {
			exec(context.Background(), client(), batch)
			if p.done(batch, true) {
				p.drain(client)
			}
		}()
	}
}

// doEach is do for several calls of one caller (AllowEach): queued
// together, so that one flush carries them all, in one round trip and on
// one node in one script call, and errs[i] is what do would return for
// cs[i]. Why not do for each in turn: each would wait for its own round
// trip. When no round trip is in flight the calls go out on the caller's
// goroutine, as a lone call does (a pipeline of the caller's calls alone);
// otherwise they wait in the queue together, each watched as do's are.
func (p *pipeline) doEach(ctx context.Context, client func() *conn, cs []*call, errs []error) {
	p.send(ctx, client, cs...)
	for i, c := range cs {
		select {
		case <-c.done:
			errs[i] = nil
			if c.state.Load() == expired {
				errs[i] = p.late
			}
		case <-ctx.Done():
			for j := i; j < len(cs); j++ {
				errs[j] = ctx.Err()
			}
			return
		}
	}
}

// done recycles a sent batch's slice and reports whether calls are queued,
// in which case the caller keeps its flusher slot and must go on (drain);
// otherwise it has given the slot back.
//
// After a shared batch the flusher yields before it looks at the queue.
// Why: the batch's callers were just made runnable on this P, and under
// steady load each is about to call again; given the P first, they queue
// and go out in the flusher's next batch, with the calls that arrived
// during the round trip. Without the yield the callers split into two
// groups that take turns, each its own round trip, and when the queue is
// empty the flusher gives its slot back first, so the first of them to
// call again finds no round trip in flight and goes out alone.
// TestRedisConcurrentCallsRarelyGoAlone bounds both (calls per round trip,
// calls alone). A lone call does not yield: its caller is the one that
// calls next, and nor does a batch of one caller's calls (doEach), for the
// same reason. While a flusher yields, a full queue does not start a second
// flusher: the yielding one is about to take it, and a new flusher is a new
// goroutine, whose stack grows through go-redis's calls (profiled: stack
// copying, when every batch started one; the same test bounds the
// goroutines started per call).
func (p *pipeline) done(batch []*call, shared bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if shared && len(batch) > 1 {
		p.yielding++
		p.mu.Unlock()
		runtime.Gosched()
		p.mu.Lock()
		p.yielding--
	}
	if p.spare == nil {
		p.spare = batch[:0]
	}
	if len(p.queue) > 0 {
		return true
	}
	p.flushers--
	return false
}

// drain sends batches until the queue is empty, then gives its flusher
// slot back.
func (p *pipeline) drain(client func() *conn) {
	for {
		p.mu.Lock()
		batch := p.take()
		if len(batch) == 0 {
			p.flushers--
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
		exec(context.Background(), client(), batch)
		if !p.done(batch, true) {
			return
		}
	}
}

// take removes up to maxBatch calls from the front of the queue. The
// caller holds mu.
func (p *pipeline) take() []*call {
	n := min(len(p.queue), maxBatch)
	if n == 0 {
		return nil
	}
	batch := p.queue[:n:n]
	if n == len(p.queue) {
		p.queue = p.spare
		p.spare = nil
	} else {
		// Rare (a queue longer than a batch): copy the rest so the batch's
		// backing array is the flusher's alone.
		p.queue = append([]*call(nil), p.queue[n:]...)
	}
	return batch
}
