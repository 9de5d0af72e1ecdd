// Package redisstore is a store.Store kept in Redis, for limits shared by
// processes on many hosts.
//
// Each decision is one EVALSHA of a Lua script that runs the same GCRA rule
// as store.Decide, atomically inside Redis, on Redis's own clock (TIME), so
// the callers' clocks never matter. Keys are "sluice:{KEY}": the hash tag
// keeps each bucket a single-slot key on Redis Cluster. A key expires when
// its bucket is full again (its TTL is the time until full), so Redis holds
// only keys that carry debt.
//
// Failures: a call that times out is never replayed, because Redis may have
// applied it; the only retry is EVAL after NOSCRIPT (the script was not
// there, so nothing ran). Callers decide what an error means (sluice serve's
// -fail).
package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-go/sluice/service/store"
)

//go:embed gcra.lua
var gcraLua string

// KeyPrefix starts every key the store writes.
const KeyPrefix = "sluice:"

// Store is a store.Store over a go-redis client (single node, Sentinel
// failover or Cluster). Safe for concurrent use; the zero value is not usable
// (use Open, OpenCluster or New). Allow blocks for one round trip, bounded by
// ctx and the client's timeouts; when ctx ends first it returns an error and
// the decision may or may not have been applied.
type Store struct {
	c      redis.UniversalClient
	script *redis.Script
}

// Defaults Open applies to a URL that sets no timeouts.
const (
	DefaultDialTimeout = 250 * time.Millisecond
	DefaultIOTimeout   = 250 * time.Millisecond
)

// Open connects to the Redis a URL names ("redis://[user:pass@]HOST:PORT/DB",
// "rediss://" for TLS, with go-redis's query options). It turns off
// go-redis's automatic retries (MaxRetries −1): after a network error the
// script may already have run, and replaying it would charge twice. Open does
// not dial; the first call does.
func Open(url string) (*Store, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redisstore: %w", err)
	}
	opt.MaxRetries = -1
	failFast(&opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout, &opt.Protocol)
	opt.ContextTimeoutEnabled = true
	opt.DisableIdentity = true
	return New(redis.NewClient(opt)), nil
}

// failFast fills in the settings that Open and OpenCluster share where the
// URL left them unset. Why shorter timeouts than go-redis's defaults (5 s
// dial, 3 s I/O): a limiter on the request path must answer or fail fast.
// Why RESP2: the script returns a flat integer array either way, and RESP3
// makes go-redis check every reply for push notifications (about 6% of the
// request's CPU, profiled). The callers also set ContextTimeoutEnabled (the
// service's per-request deadline in ctx bounds the socket read too) and
// DisableIdentity (no CLIENT SETINFO round trip on old servers).
func failFast(dial, read, write *time.Duration, protocol *int) {
	if *dial == 0 {
		*dial = DefaultDialTimeout
	}
	if *read == 0 {
		*read = DefaultIOTimeout
	}
	if *write == 0 {
		*write = DefaultIOTimeout
	}
	if *protocol == 0 {
		*protocol = 2
	}
}

// OpenCluster connects to a Redis Cluster. The URL has Open's form with the
// scheme rediscluster:// (TLS: redisclusters://) and further seed nodes as
// addr= parameters: "rediscluster://10.0.0.1:6379?addr=10.0.0.2:6379". As in
// Open, nothing is ever replayed: go-redis's cluster client retries network
// errors and timeouts within its redirect budget, so redirects are off too
// (MaxRedirects −1). A MOVED reply during resharding is then an error for
// that one request (answered per -fail) and makes the client reload the
// slot map, so the next request goes to the right node.
func OpenCluster(url string) (*Store, error) {
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
	opt.MaxRetries = -1
	opt.MaxRedirects = -1
	failFast(&opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout, &opt.Protocol)
	opt.ContextTimeoutEnabled = true
	opt.DisableIdentity = true
	return New(redis.NewClusterClient(opt)), nil
}

// New returns a Store over c, which it owns (Close closes it). Configure c
// with MaxRetries −1: go-redis otherwise retries after network errors, which
// may replay a decision Redis already applied.
func New(c redis.UniversalClient) *Store {
	return &Store{c: c, script: redis.NewScript(gcraLua)}
}

// Key returns the Redis key that holds key's bucket.
func Key(key string) string { return KeyPrefix + "{" + key + "}" }

// Allow implements store.Store with one EVALSHA (plus one EVAL the first
// time a Redis server sees the script). A timeout or network error returns an
// error: the decision may or may not have been applied, and is not retried.
func (s *Store) Allow(ctx context.Context, key string, cost int64, p store.Policy) (store.Result, error) {
	if err := store.Check(cost, p); err != nil {
		return store.Result{}, err
	}
	T := int64(p.Interval())
	keys := []string{Key(key)}
	args := []any{T, T * p.Burst, cost}
	v, err := s.c.EvalSha(ctx, s.script.Hash(), keys, args...).Int64Slice()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		// Only here is a retry safe: NOSCRIPT means nothing ran.
		v, err = s.c.Eval(ctx, gcraLua, keys, args...).Int64Slice()
	}
	if err != nil {
		return store.Result{}, fmt.Errorf("redisstore: %w", err)
	}
	if len(v) != 4 {
		return store.Result{}, fmt.Errorf("redisstore: script returned %d values, want 4", len(v))
	}
	return store.Result{
		Allowed:    v[0] == 1,
		Remaining:  float64(v[1]) / float64(T),
		ResetAfter: time.Duration(v[2]),
		RetryAfter: time.Duration(v[3]),
	}, nil
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
	if cc, ok := s.c.(*redis.ClusterClient); ok {
		var total atomic.Int64
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			n, err := count(ctx, c)
			total.Add(n)
			return err
		})
		return total.Load(), err
	}
	return count(ctx, s.c)
}

// Ping implements store.Store.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.c.Ping(ctx).Err(); err != nil {
		if errors.Is(err, redis.ErrClosed) {
			return store.ErrClosed
		}
		return fmt.Errorf("redisstore: %w", err)
	}
	return nil
}

// Name implements store.Store.
func (s *Store) Name() string { return "redis" }

// Close closes the client.
func (s *Store) Close() error { return s.c.Close() }
