package redisstore

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-go/sluice/internal/gcra"
	"github.com/sluice-go/sluice/store"
)

//go:embed gcra_all.lua
var gcraAllLua string

var gcraAll = redis.NewScript(gcraAllLua)

// DecideAll implements store.AllOrNothing with one script call that reads
// every bucket at one reading of Redis's clock and writes all of them or
// none: atomic, whatever other clients do. On Redis Cluster a script may
// only name keys of one hash slot; requests whose keys lie in several slots
// are decided one slot at a time: first every slot is looked at, then each
// spent, so a client spending between the two can leave a later slot's
// request denied and the earlier slots' spent (it then returns false, each
// out[i] saying what happened). The call is bounded as Allow is, and never
// replayed after a timeout.
func (s *Store) DecideAll(ctx context.Context, reqs []store.Request, spend bool, out []store.Result) (bool, error) {
	for _, r := range reqs {
		if err := store.Check(r.Cost, r.Policy); err != nil {
			return false, err
		}
	}
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("redisstore: %w", err)
	}
	if s.pl.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.pl.timeout)
		defer cancel()
	}
	c := s.client()
	groups := [][]int{make([]int, len(reqs))}
	for i := range reqs {
		groups[0][i] = i
	}
	if _, ok := c.(*redis.ClusterClient); ok {
		groups = bySlotIndex(reqs)
	}
	if len(groups) == 1 {
		return s.decideGroup(ctx, c, reqs, groups[0], spend, out)
	}
	all := true
	for _, g := range groups { // look at every slot first
		if _, err := s.decideGroup(ctx, c, reqs, g, false, out); err != nil {
			return false, err
		}
		for _, i := range g {
			all = all && out[i].Allowed
		}
	}
	if !spend || !all {
		return false, nil
	}
	for _, g := range groups {
		ok, err := s.decideGroup(ctx, c, reqs, g, true, out)
		if err != nil {
			return false, err
		}
		all = all && ok
	}
	return all, nil
}

// decideGroup runs the script for the requests at idx (keys of one slot).
func (s *Store) decideGroup(ctx context.Context, c redis.UniversalClient, reqs []store.Request, idx []int, spend bool, out []store.Result) (bool, error) {
	keys := make([]string, len(idx))
	args := make([]any, 1, 1+2*len(idx))
	args[0] = "0"
	if spend {
		args[0] = "1"
	}
	for j, i := range idx {
		r := reqs[i]
		T := int64(r.Policy.Interval())
		keys[j] = Key(r.Key)
		args = append(args, r.Cost*T, r.Policy.Burst*T)
	}
	v, err := gcraAll.EvalSha(ctx, c, keys, args...).Int64Slice()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") { // nothing ran: send the script itself
		v, err = gcraAll.Eval(ctx, c, keys, args...).Int64Slice()
	}
	if err != nil {
		return false, fmt.Errorf("redisstore: %w", err)
	}
	if len(v) != len(idx)+1 {
		return false, fmt.Errorf("redisstore: the all-or-nothing script answered %d values for %d requests", len(v), len(idx))
	}
	spent := v[0] == 1
	for j, i := range idx {
		r := reqs[i]
		T := int64(r.Policy.Interval())
		inc, tau := r.Cost*T, r.Policy.Burst*T
		x := v[j+1]
		switch {
		case x > 0 && spent:
			out[i] = result(x, inc, T, tau)
		case x > 0: // would pass, nothing written: the bucket as it stands
			out[i] = store.Result(gcra.Figures(true, x-inc, inc, T, tau))
		default:
			out[i] = result(x, inc, T, tau)
		}
	}
	return spent, nil
}

// bySlotIndex groups the indexes of reqs by their keys' hash slot, in the
// order each slot first appears.
func bySlotIndex(reqs []store.Request) [][]int {
	var groups [][]int
	at := map[uint16]int{}
	for i, r := range reqs {
		sl := slot(Key(r.Key))
		g, ok := at[sl]
		if !ok {
			g = len(groups)
			at[sl] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}
