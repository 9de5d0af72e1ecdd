package shmstore

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-go/sluice/sharedbucket"
	"github.com/sluice-go/sluice/store"
)

// DecideAll implements store.AllOrNothing. It looks at every bucket first
// and spends only when each request would pass; the table keeps no refunds,
// so it cannot give back a spend. Hence one race: a process that spends on
// a later request's bucket between the look and the spends can leave that
// request denied and the earlier ones spent, as they would be without
// DecideAll (it then returns false, with each out[i] saying what happened).
// Requests on one key count the ones before them in the look. It never
// blocks and ignores ctx.
func (s *Store) DecideAll(_ context.Context, reqs []store.Request, spend bool, out []store.Result) (bool, error) {
	if s.closed.Load() {
		return false, store.ErrClosed
	}
	tables := make([]*sharedbucket.Table, len(reqs))
	for i, r := range reqs {
		if err := store.Check(r.Cost, r.Policy); err != nil {
			return false, err
		}
		if len(r.Key) == 0 || len(r.Key) > sharedbucket.MaxKeyLen {
			return false, fmt.Errorf("shmstore: key of %d bytes: want 1 to %d", len(r.Key), sharedbucket.MaxKeyLen)
		}
		t, err := s.table(r.Policy)
		if err != nil {
			return false, err
		}
		tables[i] = t
	}
	all := true
	for i, r := range reqs {
		t := tables[i]
		// Tokens earlier requests of this call on the same bucket would
		// take first.
		var before int64
		for j := range i {
			if tables[j] == t && reqs[j].Key == r.Key {
				before += reqs[j].Cost
			}
		}
		wait := t.RetryAfterN(r.Key, before+r.Cost)
		if wait == sharedbucket.Never && before+r.Cost <= r.Policy.Burst {
			return false, store.ErrClosed // only a closed table says never here
		}
		T := t.Interval()
		rem := max(t.Remaining(r.Key)-float64(before), 0)
		ok := wait == 0
		out[i] = store.Result{Allowed: ok, Remaining: rem,
			ResetAfter: time.Duration((float64(r.Policy.Burst) - rem) * float64(T))}
		if !ok {
			out[i].RetryAfter = wait // until this request and the ones before it on the key fit
		}
		all = all && ok
	}
	if !spend || !all {
		return false, nil
	}
	for i, r := range reqs {
		d := tables[i].DecideN(r.Key, r.Cost)
		if d.RetryAfter == sharedbucket.Never {
			return false, store.ErrClosed
		}
		out[i] = store.Result{Allowed: d.Allowed, Remaining: d.Remaining, RetryAfter: d.RetryAfter, ResetAfter: d.ResetAfter}
		all = all && d.Allowed
	}
	return all, nil
}
