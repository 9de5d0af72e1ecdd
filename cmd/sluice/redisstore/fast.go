package redisstore

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// fast sends the decisions of a store on one Redis node (Open's) through a
// rueidis client, while go-redis keeps everything else (Ping, Keys, the
// all-or-nothing script, Sentinel and Cluster stores). Why a second client
// for this one path: rueidis writes and reads each connection on goroutines
// of its own, so round trips in flight at once (the pipeline's two
// flushers, and a lone caller's) go out and come back together, where
// go-redis takes a connection from its pool per round trip (checking it
// with a system call) and writes and reads it on the caller's goroutine.
// Measured under `sluice serve` at its peak on Redis (32 connections of one
// call each, builds with and without this path in turn, 10 rounds): the
// server and Redis together spent 7–8% less CPU per decision over gRPC
// and over HTTP, in larger script calls (5.7 against 4.4 decisions each);
// and a decision allocates less (BenchmarkRedis, docs/benchmarks.md).
//
// The client is made on the first call, not by Open: rueidis dials when it
// is made, and Open does not dial. A failed dial is that batch's error; the
// next batch dials again (as go-redis does, one dial per call). Safe for
// concurrent use.
type fast struct {
	opt     rueidis.ClientOption
	timeout time.Duration // bounds a shared batch's round trip (see exec)

	c      atomic.Pointer[rueidisClient] // nil until the first call dials
	mu     sync.Mutex                    // serialises dialing and closing
	closed bool                          // guarded by mu
}

type rueidisClient struct{ rueidis.Client }

// newFast returns the fast path for a store Open made from opt, or nil
// when opt names something rueidis is not given here (a Unix socket, a
// dialer or credentials provider set in code): such a store keeps go-redis
// for every call.
func newFast(opt *redis.Options, timeout time.Duration) *fast {
	if opt.Network != "" && opt.Network != "tcp" || opt.Dialer != nil || opt.CredentialsProvider != nil ||
		opt.CredentialsProviderContext != nil || opt.StreamingCredentialsProvider != nil {
		return nil
	}
	// Why the dial is bounded by the store's timeout too: rueidis dials
	// when its client is made, with no context, on the goroutine of the
	// call that needs it, which must return within that timeout whatever
	// dial_timeout the URL sets.
	dial := timeout
	if opt.DialTimeout > 0 && (dial <= 0 || opt.DialTimeout < dial) {
		dial = opt.DialTimeout
	}
	return &fast{timeout: timeout, opt: rueidis.ClientOption{
		InitAddress:       []string{opt.Addr},
		Username:          opt.Username,
		Password:          opt.Password,
		ClientName:        opt.ClientName,
		SelectDB:          opt.DB,
		TLSConfig:         opt.TLSConfig,
		Dialer:            net.Dialer{Timeout: dial},
		ConnWriteTimeout:  max(opt.WriteTimeout, opt.ReadTimeout),
		AlwaysRESP2:       opt.Protocol == 2,
		ClientSetInfo:     rueidis.DisableClientSetInfo, // as go-redis's DisableIdentity: no round trip for it
		ForceSingleClient: true,                         // one node: no CLUSTER probe, no topology
		DisableCache:      true,
		// Nothing is replayed (see Open): after a network error the script
		// may have run.
		DisableRetry: true,
		// A batch is at most maxBatch calls (tens of kilobytes); rueidis's
		// default is half a megabyte each way per connection.
		ReadBufferEachConn:  64 << 10,
		WriteBufferEachConn: 64 << 10,
	}}
}

// client returns the rueidis client, dialing it on first use.
func (f *fast) client() (rueidis.Client, error) {
	if c := f.c.Load(); c != nil {
		return c.Client, nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, redis.ErrClosed
	}
	if c := f.c.Load(); c != nil {
		return c.Client, nil
	}
	c, err := rueidis.NewClient(f.opt)
	if err != nil {
		return nil, err
	}
	f.c.Store(&rueidisClient{c})
	return c, nil
}

// drop closes c and makes the next call dial a fresh client, unless that
// has happened already. Why the whole client, on any error that is neither
// Redis's answer nor the caller's context: measured, a rueidis client whose
// connection broke (a Redis killed and restarted) could answer a call or
// two after Redis was back with the old connection's error, where the
// service expects the first call after its breaker's probe gets through to
// be answered. Calls in flight on c's other connections fail with it, and
// are answered per -fail, as on the broken one.
func (f *fast) drop(c rueidis.Client) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if cur := f.c.Load(); cur != nil && cur.Client == c {
		f.c.Store(nil)
		c.Close()
	}
}

// broken reports whether err says the connection failed: not Redis's own
// answer, nor the caller's context ending.
func broken(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	_, isRedis := rueidis.IsRedisErr(err)
	return !isRedis
}

// close closes the client, if one was dialed; calls on it then fail.
func (f *fast) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	if c := f.c.Swap(nil); c != nil {
		c.Close()
	}
}

// exec is exec (see script.go) over f: the same script calls, the same
// answers; NOSCRIPT answered by sending those calls again with the
// script's text. A shared batch (ctx without deadline) is bounded by f's
// timeout, as go-redis's read timeout bounds it on the other path.
func (f *fast) exec(ctx context.Context, batch []*call) {
	var scripts []script
	if len(batch) == 1 {
		scripts = []script{newScript([][]*call{batch})}
	} else {
		scripts = pack(make([]script, 0, 1), byKey(batch))
	}
	c, err := f.client()
	if err != nil {
		for i := range scripts {
			scripts[i].deliver(0, nil, err)
		}
		return
	}
	if _, ok := ctx.Deadline(); !ok && f.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, f.timeout)
		defer cancel()
	}
	evalsha := func(i int) rueidis.Completed {
		s := &scripts[i]
		return c.B().Evalsha().Sha1(gcraSHA).Numkeys(int64(len(s.keys))).Key(s.keys...).Arg(s.strArgs()...).Build()
	}
	res := do(ctx, c, len(scripts), evalsha)
	var again []int // script calls answered NOSCRIPT: nothing ran
	for i := range scripts {
		if re, ok := rueidis.IsRedisErr(res[i].Error()); ok && re.IsNoScript() {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		eval := func(j int) rueidis.Completed {
			s := &scripts[again[j]]
			return c.B().Eval().Script(gcraLua).Numkeys(int64(len(s.keys))).Key(s.keys...).Arg(s.strArgs()...).Build()
		}
		for j, r := range do(ctx, c, len(again), eval) {
			res[again[j]] = r
		}
	}
	for i := range res {
		if broken(res[i].Error()) {
			f.drop(c)
			break
		}
	}
	for i := range scripts {
		s := &scripts[i]
		if s.n == 1 {
			v, err := res[i].AsInt64()
			s.deliver(v, nil, err)
			continue
		}
		v, err := res[i].AsIntSlice()
		s.deliver(0, v, err)
	}
}

// do sends n commands, cmd(0) to cmd(n−1), in one write (Do for one: it
// costs rueidis less than a DoMulti of one).
func do(ctx context.Context, c rueidis.Client, n int, cmd func(i int) rueidis.Completed) []rueidis.RedisResult {
	if n == 1 {
		return []rueidis.RedisResult{c.Do(ctx, cmd(0))}
	}
	cmds := make(rueidis.Commands, n)
	for i := range cmds {
		cmds[i] = cmd(i)
	}
	return c.DoMulti(ctx, cmds...)
}

// strArgs is s's arguments as rueidis takes them, in goArgs' order.
func (s *script) strArgs() []string {
	var a []string
	if len(s.calls) == 1 {
		a = make([]string, 0, 2*s.n)
	} else {
		a = make([]string, 0, len(s.calls)+2*s.n)
	}
	for _, cs := range s.calls {
		if len(s.calls) > 1 {
			a = append(a, strconv.Itoa(len(cs)))
		}
		for _, b := range cs {
			inc, tau := b.strs()
			a = append(a, inc, tau)
		}
	}
	return a
}

// strs returns c.inc and c.tau formatted, formatting them again only when
// they changed since c's last use. Why: a pooled call mostly carries the
// same policy's figures again, and formatting them is two allocations a
// decision that go-redis's path does not make.
func (c *call) strs() (string, string) {
	if c.strOf != [2]int64{c.inc, c.tau} {
		c.str = [2]string{strconv.FormatInt(c.inc, 10), strconv.FormatInt(c.tau, 10)}
		c.strOf = [2]int64{c.inc, c.tau}
	}
	return c.str[0], c.str[1]
}
