// Package httplimit puts Sluice's limits where Go programs meet them: at the
// HTTP boundary.
//
// Outbound, [Transport] wraps an [http.RoundTripper] so every request first
// takes a token from a limiter (a [ratelimiter.Limiter] or anything with
// Acquire), and learns from the upstream: after a 429 or 503 that says when
// to come back (Retry-After, or the IETF RateLimit field), no request leaves
// before then.
//
//	client := &http.Client{Transport: httplimit.Transport(http.DefaultTransport, limiter)}
//
// With [Adaptive] the limiter's rate needs no figure: it follows what the
// upstream accepts, rising while answers are clean and falling on
// throttling answers, within bounds (the law is [adapt.Law]). The
// law alone sets the rate: an advertised RateLimit-Policy is its ceiling,
// and its min holds even under a policy lower still. [AdaptToPolicy]
// without it lowers the rate to the policy, never below the first rate
// divided by [PolicyFloorFactor], since an upstream may be hostile.
// Package httplimittest has a simulated upstream, a changing GCRA quota in
// memory, to test such clients in virtual time.
//
// Inbound, [Middleware] limits requests by key (the client's IP by default,
// a header, or any function of the request) over any [store.Store]: the
// in-process [store.Memory], the host-wide shmstore, Redis, or a running
// `sluice serve` through [client.Client.Store]. Denied requests get the same
// 429 answer as `sluice serve` gives: the IETF RateLimit and RateLimit-Policy
// fields, X-RateLimit-*, Retry-After and a JSON body; allowed ones carry the
// fields too.
//
//	lim, err := httplimit.NewMiddleware(store.NewMemory(), store.Policy{Rate: 10, Burst: 20})
//	if err != nil { ... }
//	http.ListenAndServe(":8080", lim.Handler(mux))
//
// A memory store made so is bounded with no more setup: it forgets a key
// whose bucket has been full for a minute ([store.DefaultSweep]) within a
// minute more of traffic, with no goroutine, and holds at most
// [store.DefaultMaxKeys] keys (past that, the keys nearest to full are
// forgotten and counted). Clients that rotate addresses cost the keys of
// the last minute or two, never every key ever seen.
//
// # Time
//
// As in every package here that waits, a Transport's time is its request's
// context's: a sched.Run loop's clock (the waits park the fiber, and virtual
// time runs an hour of a client in milliseconds), a testing/synctest
// bubble's fake time, and real time otherwise; it takes no clock option. A
// Middleware waits on nothing: its time is its store's (store.WithClock for
// the memory store).
//
// # Client IP and proxy headers
//
// By default the middleware believes no header: the key is the address of
// the TCP peer. Behind proxies, name them ([KeyByIP]("10.0.0.0/8")) and it
// reads one header, the one those proxies append the address they saw to:
// X-Forwarded-For, unless [ProxyHeader] says Forwarded (RFC 7239); the other
// header is never read. The hops are that header's entries in order, then
// the peer. Walking back from the peer past every trusted proxy, the first
// address that is not one is the client. So the header counts only when a
// trusted proxy is the peer, and only as far back as trusted proxies wrote
// it: what the client wrote to the left of their entries is never read,
// and a header the proxies leave alone (a Forwarded line a client adds in
// front of a proxy that appends X-Forwarded-For) decides nothing. Reading
// both headers cannot be made safe, since nothing in a request tells which
// one a proxy wrote. An entry that names no address ("unknown", an
// obfuscated "_hidden", anything unreadable) ends the walk at the last
// address known, the trusted proxy that wrote it; it never fails the
// request. Addresses are normalized before they become keys (IPv4-mapped
// IPv6 as IPv4, canonical IPv6 text, no zone, no port), and an IPv6 client
// is keyed by its /64 ([IPv6Prefix]), as a host can take any address of
// its network.
//
// [ratelimiter.Limiter]: https://pkg.go.dev/github.com/sluice-go/sluice/ratelimiter#Limiter
// [adapt.Law]: https://pkg.go.dev/github.com/sluice-go/sluice/adapt#Law
// [client.Client.Store]: https://pkg.go.dev/github.com/sluice-go/sluice/client#Client.Store
package httplimit
