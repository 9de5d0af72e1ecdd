// Package sluice is the root of Sluice, which limits how fast work flows.
// The root holds no code; the packages are:
//
//   - [github.com/sluice-go/sluice/ratelimiter]: start here. A blocking,
//     FIFO token bucket: Acquire waits its turn, a context cancels the wait.
//   - [github.com/sluice-go/sluice/httplimit]: an outbound http.RoundTripper
//     that honours the limit and the upstream's 429s, and an inbound
//     per-client middleware over the stores of [github.com/sluice-go/sluice/store].
//   - [github.com/sluice-go/sluice/adapt]: the control law that finds the
//     rate an upstream accepts (httplimit.Adaptive uses it; any client can).
//   - [github.com/sluice-go/sluice/sharedbucket]: one limit per key for every
//     process on a host, in a memory-mapped table (Linux, macOS).
//   - [github.com/sluice-go/sluice/sched] and [github.com/sluice-go/sluice/vclock]:
//     a cooperative run loop and a virtual clock, so tests of timing run in
//     microseconds, exactly; sched/schedtest explores seeded schedules.
//   - [github.com/sluice-go/sluice/semaphore] and [github.com/sluice-go/sluice/ticker]:
//     the FIFO semaphore and the drift-free ticker the limiter is made of.
//   - [github.com/sluice-go/sluice/lease] and [github.com/sluice-go/sluice/client]:
//     what a replica of a service imports to share one limit through sluice
//     serve: capacity leases decided locally, or a round trip per decision.
//
// The service, sluice serve, is the module github.com/sluice-go/sluice/cmd/sluice.
package sluice
