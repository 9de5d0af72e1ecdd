package decide_test

import (
	"testing"

	"github.com/sluice-go/sluice/internal/decide"
	"github.com/sluice-go/sluice/store"
)

// BenchmarkGate measures what the gate adds to one allowed decision over
// the memory store: store is the store's Allow alone, through the interface (the baseline), gate
// the same call through Gate.Allow, gate-timed with Config.Timed.
func BenchmarkGate(b *testing.B) {
	mem := store.NewMemory()
	b.Cleanup(func() { _ = mem.Close() })
	var st store.Store = mem // called through the interface, as the gate does
	p := store.Policy{Name: "p", Rate: 1e9, Burst: 1000}
	ctx := b.Context()
	b.Run("store", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := st.Allow(ctx, "k", 1, p); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, timed := range []bool{false, true} {
		name := "gate"
		if timed {
			name = "gate-timed"
		}
		g := decide.New(decide.Config{Store: mem, Timed: timed})
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			var d decide.Decision
			for b.Loop() {
				if g.Allow(ctx, "k", 1, p, &d); d.Outcome != decide.Decided {
					b.Fatal(d.Err)
				}
			}
		})
	}
}
