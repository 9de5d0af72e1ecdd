package redisstore

import (
	"context"
	"fmt"

	"github.com/sluice-go/sluice/store"
)

// AllowEach implements store.Batch: the requests go to Redis together, in
// one round trip (one pipelined write), on one node as one script call
// (gcra.lua decides several keys in one loop, a key's requests in order)
// and on a Cluster as one script call per hash slot, all in that write.
// Each request is decided as its own Allow would be, at one reading of
// Redis's clock, and spends or not on its own. Why: an Envoy request with
// several descriptors otherwise waits for a round trip per descriptor, one
// after another. Calls in flight from other callers may share the round
// trip, as Allow's do. It blocks, and is bounded, as Allow: each request
// not answered when ctx ends or the store's timeout passes gets an error,
// and may or may not have been applied.
func (s *Store) AllowEach(ctx context.Context, reqs []store.Request, out []store.Result, errs []error) {
	if err := ctx.Err(); err != nil {
		for i := range reqs {
			out[i], errs[i] = store.Result{}, fmt.Errorf("redisstore: %w", err) // nothing sent
		}
		return
	}
	// Why arrays: a request's descriptors are a handful, and these stay on
	// the caller's stack.
	var cb [8]*call
	var ab [8]int
	var eb [8]error
	cs, at, ce := cb[:0], ab[:0], eb[:0]
	if len(reqs) > len(cb) {
		cs, at, ce = make([]*call, 0, len(reqs)), make([]int, 0, len(reqs)), make([]error, 0, len(reqs))
	}
	for i, r := range reqs {
		out[i], errs[i] = store.Result{}, store.Check(r.Cost, r.Policy)
		if errs[i] != nil {
			continue // refused, as Allow refuses it: nothing sent
		}
		T := int64(r.Policy.Interval())
		c := callPool.Get().(*call)
		c.keys[0] = Key(r.Key)
		c.inc, c.tau = r.Cost*T, r.Policy.Burst*T
		cs, at, ce = append(cs, c), append(at, i), append(ce, nil)
	}
	if len(cs) == 0 {
		return
	}
	s.pl.doEach(ctx, s.conn, cs, ce)
	for j, c := range cs {
		i := at[j]
		if ce[j] != nil {
			errs[i] = fmt.Errorf("redisstore: %w", ce[j]) // c stays the flusher's
			continue
		}
		v, err := c.v, c.err
		c.v, c.err = 0, nil
		callPool.Put(c)
		if err != nil {
			errs[i] = fmt.Errorf("redisstore: %w", err)
			continue
		}
		p := reqs[i].Policy
		T := int64(p.Interval())
		out[i] = result(v, reqs[i].Cost*T, T, p.Burst*T)
	}
}
