package redisstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"
)

// exec runs batch as one pipeline and answers each call. ctx is the lone
// caller's own, or for a shared batch none: the client's read and write
// timeouts bound it, and a caller whose own context ends stops waiting
// without cutting the others' round trip short.
//
// A shared batch goes as few script calls as Redis allows (see plan): on
// one node, one for the lot (up to maxScript requests); on a Cluster, one
// per hash slot. Each decides its keys' calls, a key's in queue order, at
// one instant. Why that is exact: the calls were in flight at once, so
// Redis running them back to back within one microsecond is a schedule
// their own calls could have had, and the script gives each the answer
// that schedule gives. Why: a script call costs Redis much more than a
// key's share of one (command parsing, script lookup, the Lua call, a TIME
// read, a reply), and the flusher's batches go out one after another, so
// Redis's time per batch is part of every round trip. The bench module's
// BenchmarkRedis shows it in its redis-us/call column (script time inside
// Redis per decision, from INFO commandstats): the sluice-redisstore 1g
// row, a script call per decision, against the 16g row, the calls in
// flight at once in one script call (docs/benchmarks.md).
func exec(ctx context.Context, cn *conn, batch []*call) {
	if cn.fast != nil {
		cn.fast.exec(ctx, batch)
		return
	}
	c := cn.c
	if len(batch) == 1 {
		// Alone: a plain command, which costs go-redis less than a
		// pipeline of one.
		b := batch[0]
		b.args[0], b.args[1] = b.inc, b.tau
		cmd := c.EvalSha(ctx, gcraSHA, b.keys, b.args...)
		if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			cmd = c.Eval(ctx, gcraLua, b.keys, b.args...)
		}
		b.v, b.err = cmd.Int64()
		b.finish()
		return
	}
	scripts := plan(c, byKey(batch))
	_, _ = c.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for i := range scripts {
			s := &scripts[i]
			s.args = s.goArgs()
			s.cmd = pl.EvalSha(ctx, gcraSHA, s.keys, s.args...)
		}
		return nil
	})
	// A server that has not seen the script (a first call, a restart, a
	// SCRIPT FLUSH) answers NOSCRIPT: nothing ran, so those script calls
	// alone are sent again with the script's text.
	var again []*script
	for i := range scripts {
		if err := scripts[i].cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			again = append(again, &scripts[i])
		}
	}
	if len(again) > 0 {
		_, _ = c.Pipelined(ctx, func(pl redis.Pipeliner) error {
			for _, s := range again {
				s.cmd = pl.Eval(ctx, gcraLua, s.keys, s.args...)
			}
			return nil
		})
	}
	for i := range scripts {
		scripts[i].answer()
	}
}

// maxScript bounds the requests one script call decides when it takes
// several keys. Why: a script blocks Redis while it runs, a few µs per key
// (BenchmarkRedis's 16g redis-us/call, see exec), so a call stays within a
// millisecond or so. A key's own calls are never split: after its TAT is
// read they cost a few Lua operators each.
const maxScript = 256

// script is one script call of a shared batch.
type script struct {
	keys []string
	args []any
	// calls is per key of keys its calls, in queue order; a subslice of
	// byKey's result.
	calls [][]*call
	n     int // requests: the calls in calls
	cmd   *redis.Cmd
}

// plan packs a batch's calls, split per key (byKey), into script calls.
// Which keys one call may take depends on the client: on a single node
// (*redis.Client: a plain server or a Sentinel's master) any, on a
// Cluster those of one hash slot (else CROSSSLOT), and on any other client
// (a Ring, say, which shards keys its own way) one key per call.
func plan(c redis.UniversalClient, sends [][]*call) []script {
	switch c.(type) {
	case *redis.Client:
		return pack(make([]script, 0, 1), sends)
	case *redis.ClusterClient:
		at := bySlot(sends)
		scripts := make([]script, 0, len(sends))
		for i := 0; i < len(sends); {
			j := i + 1
			for j < len(sends) && at[j] == at[i] {
				j++
			}
			scripts = pack(scripts, sends[i:j])
			i = j
		}
		return scripts
	default:
		scripts := make([]script, len(sends))
		for i := range sends {
			scripts[i] = newScript(sends[i : i+1])
		}
		return scripts
	}
}

// bySlot orders sends by the hash slot of their keys, keeping the order of
// those in one slot, and returns each one's slot.
func bySlot(sends [][]*call) []uint16 {
	type slotted struct {
		slot  uint16
		calls []*call
	}
	s := make([]slotted, len(sends))
	for i, calls := range sends {
		s[i] = slotted{slot(calls[0].keys[0]), calls}
	}
	slices.SortStableFunc(s, func(a, b slotted) int { return cmp.Compare(a.slot, b.slot) })
	at := make([]uint16, len(sends))
	for i := range s {
		sends[i], at[i] = s[i].calls, s[i].slot
	}
	return at
}

// pack appends to dst the script calls for sends, keys any one call may
// take together, each call taking keys in order while its requests stay
// within maxScript.
func pack(dst []script, sends [][]*call) []script {
	for i := 0; i < len(sends); {
		n, j := len(sends[i]), i+1
		for j < len(sends) && n+len(sends[j]) <= maxScript {
			n += len(sends[j])
			j++
		}
		dst = append(dst, newScript(sends[i:j]))
		i = j
	}
	return dst
}

// newScript is the script call for calls, one slice per key; its
// arguments are goArgs' or strArgs', as the client takes them.
func newScript(calls [][]*call) script {
	s := script{calls: calls}
	if len(calls) == 1 {
		s.keys, s.n = calls[0][0].keys, len(calls[0])
		return s
	}
	s.keys = make([]string, len(calls))
	for i, cs := range calls {
		s.keys[i] = cs[0].keys[0]
		s.n += len(cs)
	}
	return s
}

// goArgs is s's arguments as go-redis takes them (see gcra.lua): one key's
// pairs alone, or for several keys each key's count before its pairs.
func (s *script) goArgs() []any {
	if len(s.calls) == 1 && len(s.calls[0]) == 1 {
		b := s.calls[0][0]
		b.args[0], b.args[1] = b.inc, b.tau
		return b.args
	}
	var a []any
	if len(s.calls) == 1 {
		a = make([]any, 0, 2*s.n)
	} else {
		a = make([]any, 0, len(s.calls)+2*s.n)
	}
	for _, cs := range s.calls {
		if len(s.calls) > 1 {
			a = append(a, len(cs))
		}
		for _, b := range cs {
			a = append(a, b.inc, b.tau)
		}
	}
	return a
}

// byKey splits batch into one slice of calls per key, each in queue order,
// the keys in the order of their first call.
func byKey(batch []*call) [][]*call {
	sends := make([][]*call, 0, len(batch))
	if len(batch) <= 16 {
		// Few calls: comparing keys costs less than hashing them.
	next:
		for i, b := range batch {
			for j, s := range sends {
				if s[0].keys[0] == b.keys[0] {
					sends[j] = append(s, b)
					continue next
				}
			}
			sends = append(sends, batch[i:i+1:i+1]) // a full slice: append copies
		}
		return sends
	}
	at := make(map[string]int, len(batch))
	for i, b := range batch {
		if j, ok := at[b.keys[0]]; ok {
			sends[j] = append(sends[j], b)
			continue
		}
		at[b.keys[0]] = len(sends)
		sends = append(sends, batch[i:i+1:i+1])
	}
	return sends
}

// answer hands each of s's calls its share of the reply in s.cmd (see
// deliver).
func (s *script) answer() {
	if s.n == 1 {
		v, err := s.cmd.Int64()
		s.deliver(v, nil, err)
		return
	}
	v, err := s.cmd.Int64Slice()
	s.deliver(0, v, err)
}

// deliver hands each of s's calls its share of the reply: for one call
// the integer one, else one of vs per call, in the order of s's
// arguments; or err to each.
func (s *script) deliver(one int64, vs []int64, err error) {
	if s.n == 1 {
		b := s.calls[0][0]
		b.v, b.err = one, err
		b.finish()
		return
	}
	if err == nil && len(vs) != s.n {
		err = fmt.Errorf("script returned %d values for %d requests", len(vs), s.n)
	}
	i := 0
	for _, calls := range s.calls {
		for _, b := range calls {
			if err != nil {
				b.err = err
			} else {
				b.v = vs[i]
			}
			i++
			b.finish()
		}
	}
}
