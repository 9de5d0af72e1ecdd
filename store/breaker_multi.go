package store

import (
	"context"
	"fmt"
)

// DecideAll implements AllOrNothing when the wrapped store does; while the
// breaker is open it returns the fault without asking the store.
func (b *Breaker) DecideAll(ctx context.Context, reqs []Request, spend bool, out []Result) (bool, error) {
	a, ok := b.s.(AllOrNothing)
	if !ok {
		return false, fmt.Errorf("store: %s cannot decide several requests as one", b.s.Name())
	}
	if d := b.open.Load(); d != nil {
		return false, d.err
	}
	spent, err := a.DecideAll(ctx, reqs, spend, out)
	b.record(ctx, err)
	return spent, err
}

// AllowEach implements Batch: in one call when the wrapped store is a
// Batch, else one Allow after another. Each request counts towards the
// breaker as its own Allow would; while the breaker is open every request
// gets the fault without asking the store.
func (b *Breaker) AllowEach(ctx context.Context, reqs []Request, out []Result, errs []error) {
	bs, ok := b.s.(Batch)
	if !ok {
		allowEach(ctx, b, reqs, out, errs)
		return
	}
	if d := b.open.Load(); d != nil {
		for i := range reqs {
			out[i], errs[i] = Result{}, d.err
		}
		return
	}
	bs.AllowEach(ctx, reqs, out, errs)
	for i := range reqs {
		b.record(ctx, errs[i])
	}
}
