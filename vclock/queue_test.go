package vclock

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The radix queue against a sorted model: random pushes at or after the
// time of the last pop (a clock's deadlines never go below its time), some
// at or before last after a look ahead (top without pop), ties on the
// deadline, looks, pops and sweeps. Every top is the model's earliest
// (deadline, sequence), and the count agrees.
func TestTimerQueueMatchesModel(t *testing.T) {
	for seed := uint64(1); seed <= 32; seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 11))
			var (
				q     timerQueue
				model []entry
				now   time.Duration // the last popped deadline
				seq   uint64
			)
			less := func(a, b entry) int {
				if c := cmp.Compare(a.when, b.when); c != 0 {
					return c
				}
				return cmp.Compare(a.seq, b.seq)
			}
			for step := 0; step < 4000; step++ {
				switch op := r.IntN(10); {
				case op < 5:
					var d time.Duration
					switch r.IntN(4) {
					case 0: // ties, the current instant included
						d = time.Duration(r.IntN(3))
					case 1:
						d = time.Duration(r.IntN(1 << 12))
					case 2:
						d = time.Duration(r.Int64N(1 << 40))
					default:
						d = time.Duration(r.Int64N(1 << 62))
					}
					seq++
					// Under a tie-breaker the sequence is not the arming
					// order: draw its high half.
					s := uint64(r.IntN(4))<<32 | seq
					e := entry{when: now + d, seq: s}
					q.push(e)
					model = append(model, e)
				case op < 8:
					e, ok := q.top()
					require.Equal(t, len(model) > 0, ok)
					if !ok {
						continue
					}
					want := slices.MinFunc(model, less)
					require.Equal(t, want, e, "step %d", step)
					if op < 7 { // pop; else only look (last may run ahead)
						require.Equal(t, want, q.pop())
						model = slices.DeleteFunc(model, func(x entry) bool { return x == want })
						now = want.when
					}
				default:
					drop := r.Uint64()
					keep := func(e entry) bool { return (e.seq^drop)%3 != 0 }
					q.filter(keep)
					model = slices.DeleteFunc(model, func(e entry) bool { return !keep(e) })
				}
				require.Equal(t, len(model), q.len(), "step %d", step)
			}
			for len(model) > 0 {
				e, ok := q.top()
				require.True(t, ok)
				want := slices.MinFunc(model, less)
				require.Equal(t, want, e)
				q.pop()
				model = slices.DeleteFunc(model, func(x entry) bool { return x == want })
			}
			_, ok := q.top()
			require.False(t, ok)
		})
	}
}
