// Package lease is the replica's side of capacity leases: one limit shared
// by many replicas, decided locally at the speed of a local limiter.
//
// A Client holds, per (policy, key), a lease on a share of the policy's
// capacity (a rate and a burst) and renews all its keys in one request per
// refresh interval, reporting each key's demand. A Bucket is one key's
// share as a local token bucket that satisfies ratelimiter.SharedBucket, so
//
//	c, _ := lease.NewClient(ctx, transport, lease.Options{})
//	go c.Run(ctx)                       // renew every interval
//	b, _ := c.Bucket(ctx, "api", "tenant-a")
//	rate, burst := b.Limit() // the policy's; only validated under Shared
//	lim, _ := ratelimiter.New(ctx, rate, int(burst), ratelimiter.Shared(b))
//	lim.Acquire(ctx, 1)                 // blocking FIFO, local speed
//
// gives the blocking FIFO Acquire over the global limit, with no round trip
// per decision.
//
// # The bound
//
// The server (package internal/leasealloc in this module, served by sluice
// serve) keeps the shares that may be in force at the replicas within the
// policy's rate and burst at every instant. A Bucket enforces only its
// share: it refills at the share's rate, holds at most the share's burst,
// caps its tokens at a new, smaller burst the moment the grant arrives, and
// starts a new or larger share with no more tokens than it had (new capacity
// arrives empty and fills at the rate). So the tokens held by all replicas
// together never exceed the policy's burst and grow at most at its rate:
// over any window [s, e] all replicas together admit at most
// burst + rate·(e − s). docs/leases.md argues it step by step.
//
// A lease is counted from the moment the request was sent, on this host's
// clock (monotonic: wall-clock steps do not matter), and shortened by a
// drift margin (Options.Drift) so that it ends, in real time, before the
// server's reservation does, as long as the two clocks' rates differ by less
// than the margin.
//
// # Faults
//
// A renewal that fails leaves every share in force until its expiry; past
// it, a key follows Options.Fail: store.FailClosed (the default) grants
// nothing until a renewal succeeds; store.FailOpen keeps deciding at its
// last share, which gives up the bound for availability.
//
// # Time
//
// The context given to NewClient chooses the time domain, as for
// ratelimiter.New: inside a sched.Run loop the client and its buckets use
// the loop's clock (virtual or real) and Run parks its fiber; outside any
// loop they use Options.Clock (default real time, which inside a
// testing/synctest bubble is the bubble's fake time; a *clock.Mock for tests
// that move time by hand). Give the limiter built over a Bucket the same
// context, so that both read one clock.
//
// The package pulls in no transport: a Transport is any function that
// carries a Request to a server and its Response back (HTTP with JSON, gRPC,
// or a call in memory).
package lease
