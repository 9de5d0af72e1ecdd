package store

import "context"

// Request is one request of a DecideAll: cost tokens of Key's bucket under
// Policy.
type Request struct {
	Key    string
	Cost   int64
	Policy Policy
}

// AllOrNothing is a Store that decides several requests as one, so that a
// request over the limit on one bucket spends nothing on the others
// (envoyproxy/ratelimit's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, `sluice
// serve -stop-over-limit-increment`). The memory and shm stores, the Redis
// store and Breaker implement it.
type AllOrNothing interface {
	// DecideAll decides reqs in order at one instant, each against what the
	// ones before it would leave (a key may appear more than once). With
	// spend, when every request is allowed all of them are spent and it
	// returns true; otherwise it spends nothing and returns false (see each
	// implementation for what a concurrent caller can change between its
	// steps). Without spend it only looks, and returns false.
	//
	// out[i] (len(out) ≥ len(reqs)) is what reqs[i] gets: Allowed says
	// whether it was, or would have been, allowed. When requests were
	// spent, the figures are the bucket's after the spend, as Allow's; when
	// nothing was, the bucket's as it stands (RetryAfter, for a request
	// that would be denied, as Allow's). Callers pass 1 ≤ Cost ≤ Burst and
	// valid policies; an error means no decision (and nothing spent).
	DecideAll(ctx context.Context, reqs []Request, spend bool, out []Result) (spent bool, err error)
}
