package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluice-go/sluice/store"
)

// BenchmarkMemory is one decision per call on the cases of the peers
// comparison (a hot key allowed or denied, 100k random known keys; 1
// goroutine or RunParallel), for the store and for mapMemory, the map store
// it replaced, as the same-run baseline. Run with -cpu 1,2 for 1 and 2
// goroutines under RunParallel.
func BenchmarkMemory(b *testing.B) {
	unlimited := store.Policy{Rate: 1e9, Burst: 1e12}
	perKey := store.Policy{Rate: 1000, Burst: 1000}
	onePerSec := store.Policy{Rate: 1, Burst: 1}
	many := make([]string, 100_000)
	for i := range many {
		many[i] = fmt.Sprintf("user:%07d", i)
	}
	order := make([]uint32, 1<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range order {
		order[i] = uint32(rng.IntN(len(many)))
	}
	cases := []struct {
		name string
		keys []string
		p    store.Policy
	}{
		{"hot-allowed", []string{"tenant:hot"}, unlimited},
		{"hot-denied", []string{"tenant:hot"}, onePerSec},
		{"100k-keys", many, perKey},
		// The same keys, asked for with copies of their bytes, as a service
		// parsing requests does: a table that compares the stored key's
		// bytes cannot take the shortcut of the same pointer.
		{"100k-keys-copied", many, perKey},
	}
	ctx := context.Background()
	for _, c := range cases {
		impls := []struct {
			name  string
			allow func(key string) bool
		}{
			{"memory", func() func(string) bool {
				m := store.NewMemory()
				b.Cleanup(func() { m.Close() })
				return func(k string) bool { r, _ := m.Allow(ctx, k, 1, c.p); return r.Allowed }
			}()},
			{"map", func() func(string) bool {
				m := newMapMemory(nil)
				return func(k string) bool { r, _ := m.Allow(k, 1, c.p); return r.Allowed }
			}()},
		}
		for _, im := range impls {
			for _, k := range c.keys { // steady state: every key known
				im.allow(k)
			}
			keys := c.keys
			if strings.HasSuffix(c.name, "-copied") {
				keys = make([]string, len(c.keys))
				for i, k := range c.keys {
					keys[i] = strings.Clone(k)
				}
			}
			b.Run(c.name+"/"+im.name, func(b *testing.B) {
				b.ReportAllocs()
				var start atomic.Uint32
				b.RunParallel(func(pb *testing.PB) {
					i := int(start.Add(1)) * 104729 // each goroutine at its own place in the order
					for pb.Next() {
						im.allow(keys[order[i&(len(order)-1)]%uint32(len(keys))])
						i++
					}
				})
			})
		}
	}
}
