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

// Batch is a Store that decides several independent requests in one call:
// each is decided, and spends or not, exactly as its own Allow would, in
// order (a key may appear more than once; its later requests count what
// the earlier ones spent), so the answers are those of calling Allow for
// each in turn. What it saves is the waiting: the Redis store sends them
// all in one round trip. The Redis store, the memory store (a loop of
// Allow: nothing to save in process) and Breaker implement it; for other
// stores callers fall back to Allow in turn (see AllowEach).
type Batch interface {
	// AllowEach decides reqs[i] into out[i] and errs[i] (len(out) and
	// len(errs) ≥ len(reqs)), each as Allow(ctx, reqs[i].Key,
	// reqs[i].Cost, reqs[i].Policy) would: errs[i] non-nil means no
	// decision for reqs[i] (and Allow's doc says when it may still have
	// been counted); the others are decided regardless. It blocks for
	// one round trip of the store, bounded as Allow is; when ctx ends
	// first every request not yet answered gets an error. Safe for
	// concurrent use.
	AllowEach(ctx context.Context, reqs []Request, out []Result, errs []error)
}

// AllowEach decides reqs on s as Batch.AllowEach does: in one call when s
// is a Batch, else one Allow after another.
func AllowEach(ctx context.Context, s Store, reqs []Request, out []Result, errs []error) {
	if b, ok := s.(Batch); ok {
		b.AllowEach(ctx, reqs, out, errs)
		return
	}
	allowEach(ctx, s, reqs, out, errs)
}

func allowEach(ctx context.Context, s Store, reqs []Request, out []Result, errs []error) {
	for i, r := range reqs {
		out[i], errs[i] = s.Allow(ctx, r.Key, r.Cost, r.Policy)
	}
}
