package vclock_test

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/vclock"
)

// Random arms, stops, resets and advances, some from inside callbacks,
// checked step by step against a model that sorts the armed timers by
// (deadline, arming order), or by (drawn tie, arming order) among equal
// deadlines under a tie-breaker: every fire, Next and Pending agree.
func TestTimersMatchModel(t *testing.T) {
	for seed := uint64(1); seed <= 16; seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 7))
			c := vclock.New(time.Time{})
			type armed struct {
				when time.Duration
				key  uint64 // the clock's order among equal deadlines
			}
			var (
				model  = map[int]armed{}
				timers []*vclock.Timer
				count  uint64 // arms so far, as the clock counts them
				tie    uint64
				ties   func() uint64
				fired  []int
			)
			if seed%2 == 0 {
				// Few distinct draws, so equal draws fall back on
				// arming order too.
				ties = func() uint64 { tie = r.Uint64() % 3; return tie }
				c.SetTieBreaker(ties)
			}
			now := func() time.Duration { return c.Since(vclock.Epoch()) }
			arm := func(id int, d time.Duration) {
				count++
				k := count
				if ties != nil {
					k = tie<<32 | count
				}
				model[id] = armed{now() + d, k}
			}
			randD := func() time.Duration {
				// Many equal deadlines, some zero, some far apart.
				switch r.IntN(4) {
				case 0:
					return 0
				case 1:
					return time.Duration(r.IntN(4)) * time.Millisecond
				case 2:
					return time.Duration(r.IntN(1000)) * time.Microsecond
				default:
					return time.Duration(r.Int64N(int64(time.Hour)))
				}
			}
			var add func()
			add = func() {
				id := len(timers)
				d := randD()
				timers = append(timers, nil)
				timers[id] = c.AfterFunc(d, func() {
					fired = append(fired, id)
					if r.IntN(4) == 0 { // a callback arms another timer
						add()
					}
				})
				arm(id, d)
			}
			expectNext := func() (int, armed, bool) {
				if len(model) == 0 {
					return 0, armed{}, false
				}
				ids := make([]int, 0, len(model))
				for id := range model {
					ids = append(ids, id)
				}
				sort.Slice(ids, func(i, j int) bool {
					a, b := model[ids[i]], model[ids[j]]
					if a.when != b.when {
						return a.when < b.when
					}
					return a.key < b.key
				})
				return ids[0], model[ids[0]], true
			}
			for step := 0; step < 2000; step++ {
				switch op := r.IntN(10); {
				case op < 4:
					add()
				case op < 5 && len(timers) > 0:
					id := r.IntN(len(timers))
					_, was := model[id]
					require.Equal(t, was, timers[id].Stop(), "Stop %d", id)
					delete(model, id)
				case op < 6 && len(timers) > 0:
					id := r.IntN(len(timers))
					_, was := model[id]
					d := randD()
					require.Equal(t, was, timers[id].Reset(d), "Reset %d", id)
					arm(id, d)
				default:
					id, a, ok := expectNext()
					next, pending := c.Next()
					require.Equal(t, ok, pending)
					require.Equal(t, len(model), c.Pending())
					if !ok {
						c.Advance(randD())
						continue
					}
					require.Equal(t, vclock.Epoch().Add(a.when), next)
					fired = fired[:0]
					require.True(t, c.FireNext(next))
					require.Equal(t, id, fired[0], "fired at %v", a.when)
					require.Equal(t, a.when, now())
					delete(model, id)
					// A callback's own arm is already in the model (add).
				}
			}
			// Drain: the rest fire in model order.
			for {
				id, a, ok := expectNext()
				if !ok {
					break
				}
				fired = fired[:0]
				require.True(t, c.FireNext(vclock.Epoch().Add(a.when)))
				require.Equal(t, id, fired[0])
				delete(model, id)
			}
			require.Equal(t, 0, c.Pending())
		})
	}
}
