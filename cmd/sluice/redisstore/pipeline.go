package redisstore

import (
	"cmp"
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-go/sluice/internal/monotime"
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
// alone or nearly: 16 goroutines calling without pause then make one
// round trip per 5 calls, half of them carrying one call; queued behind
// the round trip in flight, they make one per 8 (see
// TestRedisConcurrentCallsRarelyGoAlone). Why a second at all: once a
// batch's worth is waiting, a second connection keeps Redis busy while
// the first's replies are decoded.
const shareMin = 16

// maxBatch bounds one pipeline, so one write stays a few tens of kilobytes.
const maxBatch = 512

// call is one decision waiting for its reply.
type call struct {
	keys []string
	args []any
	v    int64 // the script's reply
	err  error
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

// wait is one use of a call waiting on a shared round trip, and its
// deadline (monotime).
type wait struct {
	c   *call
	seq uint64
	at  int64
}

// over reports whether w's use of its call ended (answered, expired or a
// later use). The caller holds mu.
func (w *wait) over() bool { return w.c.seq != w.seq || w.c.state.Load() != waiting }

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
func (p *pipeline) do(ctx context.Context, client func() redis.UniversalClient, c *call) error {
	p.mu.Lock()
	// Why here, under mu: a use starts with a new seq and the state
	// waiting together, so that expire, which reads both under mu, never
	// takes an entry of an earlier use for this one.
	c.seq++
	c.state.Store(waiting)
	p.queue = append(p.queue, c)
	var batch []*call
	if p.flushers == 0 || p.flushers < maxFlushers && p.yielding == 0 && len(p.queue) >= shareMin {
		p.flushers++
		batch = p.take()
	}
	lone := len(batch) == 1 && batch[0] == c
	if !lone && p.timeout > 0 {
		p.watch(c)
	}
	p.mu.Unlock()
	switch {
	case lone:
		if p.timeout > 0 {
			bctx, cancel := context.WithTimeout(ctx, p.timeout)
			exec(bctx, client(), batch)
			cancel()
		} else {
			exec(ctx, client(), batch)
		}
		if p.done(batch) {
			go p.drain(client)
		}
	case len(batch) > 0:
		go func() {
			exec(context.Background(), client(), batch)
			if p.done(batch) {
				p.drain(client)
			}
		}()
	}
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

// watch adds c's use to the watched calls, its deadline p.timeout from
// now, and sets the timer if it is not set. The caller holds mu.
//
// Why one timer and not a context.WithTimeout per call: the per-call
// context cost a timer, seven allocations and its parent's cancel
// bookkeeping, about 2 µs of `sluice serve`'s CPU per decision (profiled).
// Every call's bound is the same, so deadlines come in the order calls
// are watched: the oldest watched call's deadline is the next one due,
// and one timer set for it serves all. Most calls are answered long
// before it; their entries are dropped from the front here, as later
// calls come, and by expire, so waits holds about the calls in flight.
func (p *pipeline) watch(c *call) {
	for p.head < len(p.waits) && p.waits[p.head].over() {
		p.waits[p.head] = wait{}
		p.head++
	}
	switch {
	case p.head == len(p.waits):
		p.waits, p.head = p.waits[:0], 0
	case p.head >= 64 && 2*p.head >= len(p.waits):
		n := copy(p.waits, p.waits[p.head:])
		clear(p.waits[n:])
		p.waits, p.head = p.waits[:n], 0
	}
	p.waits = append(p.waits, wait{c: c, seq: c.seq, at: monotime.Now() + int64(p.timeout)})
	if !p.armed && !p.stopped {
		p.armed = true
		p.timer.Reset(p.timeout)
	}
}

// expire runs when the timer fires: it wakes each watched call whose
// deadline has passed and that is still waiting, drops the calls that are
// over, and sets the timer for the next deadline, if any.
func (p *pipeline) expire() {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := monotime.Now()
	for ; p.head < len(p.waits); p.head++ {
		w := &p.waits[p.head]
		if !w.over() {
			if w.at > now {
				if !p.stopped {
					p.timer.Reset(time.Duration(w.at - now))
				}
				return
			}
			if w.c.state.CompareAndSwap(waiting, expired) {
				w.c.done <- struct{}{} // the use's only send: never blocks
			}
		}
		*w = wait{}
	}
	p.waits, p.head = p.waits[:0], 0
	p.armed = false
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
// groups that take turns, each its own round trip (16 goroutines: one
// round trip per 8 calls, not per 13), and when the queue is empty the
// flusher gives its slot back first, so the first of them to call again
// finds no round trip in flight and goes out alone (a quarter to half of
// the round trips). See TestRedisConcurrentCallsRarelyGoAlone. A lone
// call does not yield: its caller is the one that calls next. While a
// flusher yields, a full queue does not start a second flusher: the
// yielding one is about to take it, and a new flusher is a new goroutine,
// whose stack grows through go-redis's calls (profiled: a tenth of the
// client's CPU in stack copying when every batch started one).
func (p *pipeline) done(batch []*call) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(batch) > 1 {
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
func (p *pipeline) drain(client func() redis.UniversalClient) {
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
		if !p.done(batch) {
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

// exec runs batch as one pipeline and answers each call. ctx is the lone
// caller's own, or for a shared batch none: the client's read and write
// timeouts bound it, and a caller whose own context ends stops waiting
// without cutting the others' round trip short.
//
// A shared batch goes as few script calls as Redis allows (see plan): on
// one node, one for the lot (up to maxScript requests); on a Cluster, one
// per hash slot. Each decides its keys' calls, a key's in queue order, at
// one instant. Why that is exact: the calls were in flight at once, so
// Redis running them back to back within one microsecond is a schedule
// their own calls could have had, and the script gives each the answer
// that schedule gives. Why: a script call costs Redis much more than a
// key's share of one (command parsing, script lookup, the Lua call, a TIME
// read, a reply), and the flusher's batches go out one after another, so
// Redis's time per batch is part of every round trip. Measured (INFO
// commandstats, 13 keys a batch on loopback): about 7 µs of script time
// per key as a call of its own, about 3.5 µs in one call for the 13, most
// of it the key's SET.
func exec(ctx context.Context, c redis.UniversalClient, batch []*call) {
	if len(batch) == 1 {
		// Alone: a plain command, which costs go-redis less than a
		// pipeline of one.
		b := batch[0]
		cmd := c.EvalSha(ctx, gcraSHA, b.keys, b.args...)
		if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			cmd = c.Eval(ctx, gcraLua, b.keys, b.args...)
		}
		b.v, b.err = cmd.Int64()
		b.finish()
		return
	}
	scripts := plan(c, byKey(batch))
	_, _ = c.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for i := range scripts {
			s := &scripts[i]
			s.cmd = pl.EvalSha(ctx, gcraSHA, s.keys, s.args...)
		}
		return nil
	})
	// A server that has not seen the script (a first call, a restart, a
	// SCRIPT FLUSH) answers NOSCRIPT: nothing ran, so those script calls
	// alone are sent again with the script's text.
	var again []*script
	for i := range scripts {
		if err := scripts[i].cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			again = append(again, &scripts[i])
		}
	}
	if len(again) > 0 {
		_, _ = c.Pipelined(ctx, func(pl redis.Pipeliner) error {
			for _, s := range again {
				s.cmd = pl.Eval(ctx, gcraLua, s.keys, s.args...)
			}
			return nil
		})
	}
	for i := range scripts {
		scripts[i].answer()
	}
}

// maxScript bounds the requests one script call decides when it takes
// several keys. Why: a script blocks Redis while it runs, about 3 µs per
// key, so a call stays within a millisecond or so. A key's own calls are
// never split: after its TAT is read they cost a few Lua operators each.
const maxScript = 256

// script is one script call of a shared batch.
type script struct {
	keys []string
	args []any
	// calls is per key of keys its calls, in queue order; a subslice of
	// byKey's result.
	calls [][]*call
	n     int // requests: the calls in calls
	cmd   *redis.Cmd
}

// plan packs a batch's calls, split per key (byKey), into script calls.
// Which keys one call may take depends on the client: on a single node
// (*redis.Client: a plain server or a Sentinel's master) any, on a
// Cluster those of one hash slot (else CROSSSLOT), and on any other client
// (a Ring, say, which shards keys its own way) one key per call.
func plan(c redis.UniversalClient, sends [][]*call) []script {
	switch c.(type) {
	case *redis.Client:
		return pack(make([]script, 0, 1), sends)
	case *redis.ClusterClient:
		at := bySlot(sends)
		scripts := make([]script, 0, len(sends))
		for i := 0; i < len(sends); {
			j := i + 1
			for j < len(sends) && at[j] == at[i] {
				j++
			}
			scripts = pack(scripts, sends[i:j])
			i = j
		}
		return scripts
	default:
		scripts := make([]script, len(sends))
		for i := range sends {
			scripts[i] = newScript(sends[i : i+1])
		}
		return scripts
	}
}

// bySlot orders sends by the hash slot of their keys, keeping the order of
// those in one slot, and returns each one's slot.
func bySlot(sends [][]*call) []uint16 {
	type slotted struct {
		slot  uint16
		calls []*call
	}
	s := make([]slotted, len(sends))
	for i, calls := range sends {
		s[i] = slotted{slot(calls[0].keys[0]), calls}
	}
	slices.SortStableFunc(s, func(a, b slotted) int { return cmp.Compare(a.slot, b.slot) })
	at := make([]uint16, len(sends))
	for i := range s {
		sends[i], at[i] = s[i].calls, s[i].slot
	}
	return at
}

// pack appends to dst the script calls for sends, keys any one call may
// take together, each call taking keys in order while its requests stay
// within maxScript.
func pack(dst []script, sends [][]*call) []script {
	for i := 0; i < len(sends); {
		n, j := len(sends[i]), i+1
		for j < len(sends) && n+len(sends[j]) <= maxScript {
			n += len(sends[j])
			j++
		}
		dst = append(dst, newScript(sends[i:j]))
		i = j
	}
	return dst
}

// newScript is the script call for calls, one slice per key (see gcra.lua
// for the arguments).
func newScript(calls [][]*call) script {
	if len(calls) == 1 {
		return script{keys: calls[0][0].keys, args: args(calls[0]), calls: calls, n: len(calls[0])}
	}
	s := script{keys: make([]string, len(calls)), calls: calls}
	for _, cs := range calls {
		s.n += len(cs)
	}
	s.args = make([]any, 0, len(calls)+2*s.n)
	for i, cs := range calls {
		s.keys[i] = cs[0].keys[0]
		s.args = append(s.args, len(cs))
		for _, b := range cs {
			s.args = append(s.args, b.args...)
		}
	}
	return s
}

// byKey splits batch into one slice of calls per key, each in queue order,
// the keys in the order of their first call.
func byKey(batch []*call) [][]*call {
	sends := make([][]*call, 0, len(batch))
	if len(batch) <= 16 {
		// Few calls: comparing keys costs less than hashing them.
	next:
		for i, b := range batch {
			for j, s := range sends {
				if s[0].keys[0] == b.keys[0] {
					sends[j] = append(s, b)
					continue next
				}
			}
			sends = append(sends, batch[i:i+1:i+1]) // a full slice: append copies
		}
		return sends
	}
	at := make(map[string]int, len(batch))
	for i, b := range batch {
		if j, ok := at[b.keys[0]]; ok {
			sends[j] = append(sends[j], b)
			continue
		}
		at[b.keys[0]] = len(sends)
		sends = append(sends, batch[i:i+1:i+1])
	}
	return sends
}

// args is the script's arguments for calls on one key: each call's pair.
func args(calls []*call) []any {
	if len(calls) == 1 {
		return calls[0].args
	}
	a := make([]any, 0, 2*len(calls))
	for _, b := range calls {
		a = append(a, b.args...)
	}
	return a
}

// answer hands each of s's calls its share of the reply: one integer for
// one call, else one per call, in the order of s's arguments.
func (s *script) answer() {
	if s.n == 1 {
		b := s.calls[0][0]
		b.v, b.err = s.cmd.Int64()
		b.finish()
		return
	}
	v, err := s.cmd.Int64Slice()
	if err == nil && len(v) != s.n {
		err = fmt.Errorf("script returned %d values for %d requests", len(v), s.n)
	}
	i := 0
	for _, calls := range s.calls {
		for _, b := range calls {
			if err != nil {
				b.err = err
			} else {
				b.v = v[i]
			}
			i++
			b.finish()
		}
	}
}
