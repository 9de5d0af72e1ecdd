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
