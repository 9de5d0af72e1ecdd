// Package redisstore is a store.Store kept in Redis, for limits shared by
// processes on many hosts.
//
// Each decision runs a Lua script (EVALSHA) that applies the same GCRA rule
// as the other stores (internal/gcra), atomically inside Redis, on Redis's own clock (TIME), so
// the callers' clocks never matter. Decisions in flight at once share a
// round trip and a script call: they go to Redis as one pipelined write,
// as one script call (on Cluster one per hash slot) that decides each
// key's requests in order, each with the answer it would get alone, so the
// cost per decision falls as concurrency rises; AllowEach sends one
// caller's several requests (an Envoy request's descriptors) together the
// same way, in one round trip. Keys are "sluice:{KEY}": the hash tag
// keeps each bucket a single-slot key on Redis Cluster. A key expires when
// its bucket is full again (its TTL is the time until full), so Redis holds
// only keys that carry debt.
//
// Clients: go-redis (github.com/redis/go-redis/v9) for Sentinel, Cluster and
// New's stores, and for every store's Ping, Keys and DecideAll; a store from
// Open (one node) sends its decisions through rueidis
// (github.com/redis/rueidis), which costs less CPU per decision under
// concurrent load (see fast.go).
//
// Failures: a call that times out is never replayed, because Redis may have
// applied it; both clients' command retries and go-redis's dial retries are
// off, so the only retry is EVAL after NOSCRIPT (the script was not there,
// so nothing ran). Callers decide what an error means (sluice serve's -fail); wrap the
// store in store.NewBreaker so that an outage costs callers nothing while a
// background probe waits for Redis to return.
package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-go/sluice/internal/gcra"
	"github.com/sluice-go/sluice/internal/selfbound"
	"github.com/sluice-go/sluice/store"
)

//go:embed gcra.lua
var gcraLua string

// gcraSHA is the script's SHA1, what EVALSHA names it by.
var gcraSHA = redis.NewScript(gcraLua).Hash()

// KeyPrefix starts every key the store writes.
const KeyPrefix = "sluice:"

// Store is a store.Store over Redis (single node, Sentinel failover or
// Cluster). Safe for concurrent use; the zero value is not usable
// (use Open, OpenCluster or New). Allow blocks for one round trip, bounded by
// ctx and the client's timeouts, and on a store from Open or OpenCluster by
// the timeout (WithTimeout) from the call's start, its wait for a shared
// round trip included; when ctx ends or the bound passes first it returns an
// error and the decision may or may not have been applied.
type Store struct {
	// Why: internal/decide's Gate then skips its per-call context (see
	// internal/selfbound); the pipeline bounds the calls more cheaply.
	selfBound
	cur atomic.Pointer[conn] // the clients in use; replaced by Ping (see renew)
	// renew builds fresh clients from the options Open parsed; nil for New.
	renew func() *conn

	pl pipeline // the calls in flight, sent together (see pipeline.go)

	mu     sync.Mutex // serialises replacing and closing the client
	closed bool       // guarded by mu
}

// conn is a store's clients: go-redis's, and for a store from Open the
// path its decisions take (see fast), nil otherwise.
type conn struct {
	c    redis.UniversalClient
	fast *fast
}

// close closes both clients.
func (cn *conn) close() error {
	if cn.fast != nil {
		cn.fast.close()
	}
	return cn.c.Close()
}

type selfBound = selfbound.Marker

// DefaultTimeout bounds dialing, reading and writing when neither the URL
// nor WithTimeout sets them.
const DefaultTimeout = 250 * time.Millisecond

// Option configures Open and OpenCluster.
type Option func(*options)

type options struct{ timeout time.Duration }

// WithTimeout sets the clients' dial, read and write timeouts (default
// DefaultTimeout; `sluice serve` passes -store-timeout), and the bound on
// each Allow from its start to its answer, queueing for a shared round trip
// included. A URL that sets dial_timeout, read_timeout or write_timeout keeps
// its own value for that setting; the bound on Allow stays d.
func WithTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// Open connects to the Redis a URL names ("redis://[user:pass@]HOST:PORT/DB",
// "rediss://" for TLS, with go-redis's query options). Its decisions go
// through rueidis with the same address, credentials, database, TLS and
// timeouts (a Unix socket keeps go-redis for them). Nothing is ever
// replayed: go-redis's command retries are off (MaxRetries −1), because after
// a network error the script may already have run and replaying it would
// charge twice; a failed dial is not retried either (DialerRetries 1), so a
// refused connection fails in microseconds instead of five dials and their
// back-offs. Open does not dial; the first call does.
func Open(url string, opts ...Option) (*Store, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redisstore: %w", err)
	}
	o := collect(opts)
	failFast(o.timeout, &opt.MaxRetries, &opt.DialerRetries, &opt.Protocol,
		&opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout, &opt.ContextTimeoutEnabled, &opt.DisableIdentity)
	return renewable(func() *conn { return &conn{redis.NewClient(opt), newFast(opt, o.timeout)} }, o.timeout), nil
}

func collect(opts []Option) options {
	o := options{timeout: DefaultTimeout}
	for _, f := range opts {
		f(&o)
	}
	if o.timeout <= 0 {
		o.timeout = DefaultTimeout
	}
	return o
}

// failFast sets what Open, OpenCluster and OpenSentinel share, given the
// fields of their go-redis options type (three types with the same
// settings): no command retries and one dial (see Open), the dial, read
// and write timeouts and RESP2 where the URL left them unset,
// ContextTimeoutEnabled (the service's per-request deadline in ctx bounds
// the socket read too) and DisableIdentity (no CLIENT SETINFO round trip on
// old servers). Why shorter timeouts than go-redis's defaults (5 s dial,
// 3 s I/O): a limiter on the request path must answer or fail fast. Why
// RESP2: the script returns a flat integer array either way, and RESP3
// makes go-redis check every reply for push notifications, client CPU on
// every call for nothing.
func failFast(timeout time.Duration, maxRetries, dialerRetries, protocol *int,
	dial, read, write *time.Duration, contextTimeout, noIdentity *bool) {
	*maxRetries = -1
	*dialerRetries = 1
	for _, d := range []*time.Duration{dial, read, write} {
		if *d == 0 {
			*d = timeout
		}
	}
	if *protocol == 0 {
		*protocol = 2
	}
	*contextTimeout = true
	*noIdentity = true
}

// OpenCluster connects to a Redis Cluster. The URL has Open's form with the
// scheme rediscluster:// (TLS: redisclusters://) and further seed nodes as
// addr= parameters: "rediscluster://10.0.0.1:6379?addr=10.0.0.2:6379". As in
// Open, nothing is ever replayed: go-redis's cluster client retries network
// errors and timeouts within its redirect budget, so redirects are off too
// (MaxRedirects −1). A MOVED reply during resharding is then an error for
// the requests its script call carried (answered per -fail: the requests in
// flight at once on keys of that slot) and makes the client reload the slot
// map, so the next request goes to the right node; so is an ASK or a
// TRYAGAIN (a slot mid-migration, with some of the call's keys moved).
func OpenCluster(url string, opts ...Option) (*Store, error) {
	u := url
	switch {
	case strings.HasPrefix(u, "rediscluster://"):
		u = "redis://" + strings.TrimPrefix(u, "rediscluster://")
	case strings.HasPrefix(u, "redisclusters://"):
		u = "rediss://" + strings.TrimPrefix(u, "redisclusters://")
	default:
		return nil, fmt.Errorf("redisstore: cluster URL %q: want rediscluster://HOST:PORT[?addr=HOST:PORT...]", url)
	}
	opt, err := redis.ParseClusterURL(u)
	if err != nil {
		return nil, fmt.Errorf("redisstore: %w", err)
	}
	o := collect(opts)
	failFast(o.timeout, &opt.MaxRetries, &opt.DialerRetries, &opt.Protocol,
		&opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout, &opt.ContextTimeoutEnabled, &opt.DisableIdentity)
	opt.MaxRedirects = -1
	return renewable(func() *conn { return &conn{c: redis.NewClusterClient(opt)} }, o.timeout), nil
}

// renewable is a Store over the client newClient makes, which Ping may make
// again (see renew), each Allow bounded by timeout: what Open,
// OpenCluster and OpenSentinel return.
func renewable(newConn func() *conn, timeout time.Duration) *Store {
	s := &Store{renew: newConn}
	s.cur.Store(newConn())
	s.bound(timeout)
	return s
}

// New returns a Store over c, which it owns (Close closes it). Configure c
// with MaxRetries −1: go-redis otherwise retries after network errors, which
// may replay a decision Redis already applied; and with DialerRetries 1 so
// that a refused connection fails at once. Its Allow is bounded by ctx and
// c's own timeouts only.
func New(c redis.UniversalClient) *Store {
	s := &Store{}
	s.cur.Store(&conn{c: c})
	return s
}

// bound makes each Allow return within d of its start (see pipeline.do).
func (s *Store) bound(d time.Duration) {
	s.pl.init(d)
	selfbound.Set(&s.selfBound, d)
}

func (s *Store) client() redis.UniversalClient { return s.cur.Load().c }

// conn returns the clients in use (the pipeline's way to them).
func (s *Store) conn() *conn { return s.cur.Load() }

// Key returns the Redis key that holds key's bucket.
func Key(key string) string { return KeyPrefix + "{" + key + "}" }

// Allow implements store.Store with one EVALSHA (plus one EVAL the first
// time a Redis server sees the script), sent in one pipeline with the other
// calls in flight at that moment, which share it (on Cluster, those whose
// keys are in one hash slot). It blocks for that round trip, bounded by
// ctx's deadline and the client's timeouts; a call waiting on a round trip it
// shares also stops waiting when ctx is cancelled (a call sent alone goes out
// on the caller's goroutine, as a plain go-redis call does, where a cancel
// without a deadline does not cut the read short). On a store from Open or
// OpenCluster it also returns within the timeout (WithTimeout) from its
// start, with an error wrapping context.DeadlineExceeded. A ctx already ended
// sends nothing. A timeout, a network error or an ended ctx returns an error:
// the decision may or may not have been applied, and is not retried.
func (s *Store) Allow(ctx context.Context, key string, cost int64, p store.Policy) (store.Result, error) {
	if err := store.Check(cost, p); err != nil {
		return store.Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return store.Result{}, fmt.Errorf("redisstore: %w", err) // nothing sent
	}
	T := int64(p.Interval())
	inc, tau := cost*T, p.Burst*T
	c := callPool.Get().(*call)
	c.keys[0] = Key(key)
	c.inc, c.tau = inc, tau
	if err := s.pl.do(ctx, s.conn, c); err != nil {
		return store.Result{}, fmt.Errorf("redisstore: %w", err) // c stays the flusher's
	}
	v, err := c.v, c.err
	c.v, c.err = 0, nil
	callPool.Put(c)
	if err != nil {
		return store.Result{}, fmt.Errorf("redisstore: %w", err)
	}
	return result(v, inc, T, tau), nil
}

// result is the Result of the script's reply v (see gcra.lua) to a request
// of inc = cost·T: v > 0 is an allowed request and the debt it leaves
// (TAT' − now), v < 0 a denied one and the debt it found, −v − 1
// (max(TAT − now, 0)). The figures are gcra.Figures', as every store's.
func result(v, inc, T, tau int64) store.Result {
	if v > 0 {
		return store.Result(gcra.Figures(true, v, inc, T, tau))
	}
	return store.Result(gcra.Figures(false, -v-1, inc, T, tau))
}

// Keys implements store.Store by scanning for the store's keys (every master
// of a Cluster). It costs O(keys); meant for /stats, not the hot path.
func (s *Store) Keys(ctx context.Context) (int64, error) {
	count := func(ctx context.Context, c redis.Cmdable) (int64, error) {
		var n int64
		it := c.Scan(ctx, 0, KeyPrefix+"{*", 1000).Iterator()
		for it.Next(ctx) {
			n++
		}
		return n, it.Err()
	}
	c := s.client()
	if cc, ok := c.(*redis.ClusterClient); ok {
		var total atomic.Int64
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			n, err := count(ctx, c)
			total.Add(n)
			return err
		})
		return total.Load(), err
	}
	return count(ctx, c)
}

// Ping implements store.Store. When the client fails, Ping also asks a
// fresh client built from the same options (stores from Open and
// OpenCluster) and, if that one gets through, makes it the store's client.
// Why: after as many failed dials as its pool size, a go-redis pool answers
// every call with its last dial error and redials only once a second in the
// background, so a Redis that is back would go unused for up to a second.
// Ping is what a breaker probes with, so recovery takes one probe.
func (s *Store) Ping(ctx context.Context) error {
	err := s.client().Ping(ctx).Err()
	if err == nil {
		return nil
	}
	if errors.Is(err, redis.ErrClosed) {
		return store.ErrClosed
	}
	if s.renew != nil && ctx.Err() == nil {
		fresh := s.renew()
		if ferr := fresh.c.Ping(ctx).Err(); ferr == nil {
			s.mu.Lock()
			if s.closed {
				s.mu.Unlock()
				_ = fresh.close()
				return store.ErrClosed
			}
			old := s.cur.Swap(fresh)
			s.mu.Unlock()
			_ = old.close() // calls still on it fail and are answered per -fail
			return nil
		}
		_ = fresh.close()
	}
	return fmt.Errorf("redisstore: %w", err)
}

// Name implements store.Store.
func (s *Store) Name() string { return "redis" }

// Close closes the client.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.pl.stop()
	return s.conn().close()
}

// SetLogger sends go-redis's own log lines to l instead of the standard
// logger's plain text: failed dials at Debug level (a store.Breaker already
// logs the outage once, and a probe's dial would add lines every probe),
// everything else at Warn. It sets go-redis's process-wide logger: call it
// once, from main.
func SetLogger(l *slog.Logger) { redis.SetLogger(slogAdapter{l}) }

type slogAdapter struct{ l *slog.Logger }

func (a slogAdapter) Printf(ctx context.Context, format string, v ...any) {
	msg := strings.TrimSpace(fmt.Sprintf(format, v...))
	level := slog.LevelWarn
	if strings.Contains(msg, "failed to dial") {
		level = slog.LevelDebug
	}
	a.l.Log(ctx, level, "go-redis: "+msg, "store", "redis")
}
