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
// [ratelimiter.Limiter]: https://pkg.go.dev/github.com/sluice-go/sluice/ratelimiter#Limiter
// [client.Client.Store]: https://pkg.go.dev/github.com/sluice-go/sluice/client#Client.Store
package httplimit
