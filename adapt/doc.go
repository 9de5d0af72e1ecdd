// Package adapt is a control law that finds the rate an upstream accepts
// and keeps a limiter at it: rising while answers are clean, falling on
// throttles, within bounds. httplimit.Adaptive wires one into an HTTP
// Transport; a Law stands alone for any other client (gRPC, a queue, a
// database), fed the answers by its caller.
//
//	lim, _ := ratelimiter.New(ctx, 10, 10)
//	law, _ := adapt.New(lim, 1, 1000)
//	sent := time.Now()
//	// ... send the request, then report its answer:
//	law.OK(sent, time.Now())                       // served
//	law.Throttled(sent, time.Now(), 2*time.Second) // refused as too fast
//
// Time: a Law reads no clock. Every report carries the caller's instants
// (sched.Now for fibers of a loop, time.Now otherwise), which keeps the law
// exact under virtual time and in a testing/synctest bubble.
package adapt
