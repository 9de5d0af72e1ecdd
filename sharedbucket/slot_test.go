//go:build linux || darwin

package sharedbucket

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// These tests force collisions by choosing hashes directly: hashAt(home, id)
// lands in home's probe window with identity id.

const slotT = int64(100 * time.Millisecond) // T of slotPolicy

var slotPolicy = Policy{Limit: 10, Window: time.Second} // b = 10, τ = 1s

func hashAt(home, id uint64) uint64 { return home | id<<32 }

// pos returns where h sits in its probe window, or -1.
func pos(tb *Table, h uint64) int {
	home := h & tb.mask
	found := -1
	for i := range uint64(probeWindow) {
		if slotAt(tb.slots, (home+i)&tb.mask).key.Load() == h {
			if found >= 0 {
				return -2 // a duplicate
			}
			found = int(i)
		}
	}
	return found
}

func remainingH(tb *Table, h uint64, now int64) float64 {
	s := tb.find(h)
	if s == nil {
		return float64(tb.burst)
	}
	return tb.remaining(tb.debtOf(h, s, now, false))
}

// TestLookupBeforeClaim: a drained key one slot past a reclaimable one is
// found where it sits, not handed the reclaimable slot and a fresh bucket:
// it stays denied, the reclaimable slot keeps its key, and after T exactly
// one token is back.
func TestLookupBeforeClaim(t *testing.T) {
	tb := openTemp(t, slotPolicy, WithSlots(64))
	a, b := hashAt(5, 1), hashAt(5, 2)
	require.True(t, tb.decideFrom(b, 1, t0-slotT/2, false, nil).ok) // b at pos 0, full again at t0+T/2
	require.True(t, tb.decideFrom(a, 10, t0, false, nil).ok)        // a at pos 1, drained
	require.Equal(t, 0, pos(tb, b))
	require.Equal(t, 1, pos(tb, a))

	now := t0 + slotT*3/4
	assert.False(t, tb.decideFrom(a, 1, now, false, nil).ok, "a is drained wherever it sits")
	assert.Equal(t, 0, pos(tb, b), "b's reclaimable slot was not claimed")
	assert.Equal(t, 1, pos(tb, a))
	allowed := 0
	for range 10 {
		if tb.decideFrom(a, 1, now+slotT, false, nil).ok {
			allowed++
		}
	}
	assert.Equal(t, 1, allowed, "one token back after T, not a fresh burst")
}

// TestEvictionNearestToFull: a window of live buckets gives a new key the
// slot of the bucket nearest to full; the victim comes back to a full
// bucket (more than it had, never less).
func TestEvictionNearestToFull(t *testing.T) {
	tb := openTemp(t, slotPolicy, WithSlots(64))
	var keys []uint64
	for i := range uint64(probeWindow) {
		h := hashAt(9, 100+i)
		keys = append(keys, h)
		// Debts 8T, 3T, 9T, ... : key 1 has the smallest.
		cost := []int64{8, 3, 9, 5, 4, 10, 6, 7}[i]
		require.True(t, tb.decideFrom(h, cost, t0, false, nil).ok)
		require.Equal(t, int(i), pos(tb, h))
	}
	before := remainingH(tb, keys[1], t0)
	require.Equal(t, 7.0, before)

	newKey := hashAt(9, 999)
	assert.True(t, tb.decideFrom(newKey, 1, t0, false, nil).ok, "a full window never denies a new key")
	assert.Equal(t, 1, pos(tb, newKey), "took the slot nearest to full")
	assert.Equal(t, -1, pos(tb, keys[1]))
	assert.Equal(t, 9.0, remainingH(tb, newKey, t0), "the victim's debt was forgiven, not charged to the new key")
	assert.EqualValues(t, 1, tb.Stats().Evicted)
	for i, h := range keys {
		if i != 1 {
			assert.Equal(t, i, pos(tb, h), "only the victim moved")
		}
	}
	after := remainingH(tb, keys[1], t0)
	assert.GreaterOrEqual(t, after, before, "looser, never tighter")
	assert.Equal(t, 10.0, after)
}

func TestFullWindowOfDrainedKeys(t *testing.T) {
	tb := openTemp(t, slotPolicy, WithSlots(8))
	for i := range uint64(8) {
		require.True(t, tb.decideFrom(hashAt(0, 1+i), 10, t0, false, nil).ok)
	}
	for i := range uint64(20) {
		assert.True(t, tb.decideFrom(hashAt(0, 500+i), 1, t0, false, nil).ok, "new key %d", i)
	}
	assert.EqualValues(t, 20, tb.Stats().Evicted)
}

// TestReclaimFullBucket: a slot whose bucket is full is free, without
// eviction, and keeps the new key's arithmetic exact.
func TestReclaimFullBucket(t *testing.T) {
	tb := openTemp(t, slotPolicy, WithSlots(8))
	for i := range uint64(8) {
		require.True(t, tb.decideFrom(hashAt(0, 1+i), 10, t0, false, nil).ok)
	}
	// By t0+τ every bucket is full: all 8 slots are free. (At exactly t0+τ
	// a new owner would start 1 ns in debt: its starting TAT must differ
	// from the one it replaces, see takeOver.)
	later := t0 + 10*slotT + 1
	for i := range uint64(8) {
		require.True(t, tb.decideFrom(hashAt(0, 50+i), 10, later, false, nil).ok)
	}
	assert.Zero(t, tb.Stats().Evicted)
	for i := range uint64(8) {
		assert.Equal(t, 0.0, remainingH(tb, hashAt(0, 50+i), later))
		assert.Equal(t, -1, pos(tb, hashAt(0, 1+i)))
	}
}

// TestGivenBackSlotForgiven: a slot given back (key 0) while a racing spend
// left debt on it belongs to nobody; the next key claiming it starts full.
func TestGivenBackSlotForgiven(t *testing.T) {
	tb := openTemp(t, slotPolicy, WithSlots(64))
	s := slotAt(tb.slots, 30)
	s.tat.Store(t0 + 5*slotT) // debt, no key
	h := hashAt(30, 1)
	require.True(t, tb.decideFrom(h, 10, t0, false, nil).ok, "a fresh key has its whole burst")
	assert.Equal(t, 0, pos(tb, h))
}

// TestForgetNoTombstones: forgetting a key empties its slot, and keys
// further along its window are still found (lookups never stop at an empty
// slot).
func TestForgetNoTombstones(t *testing.T) {
	tb := openTemp(t, slotPolicy, WithSlots(64))
	// Find two real keys with the same home, so Forget (which hashes) can
	// be used.
	byHome := map[uint64]string{}
	var k1, k2 string
	for i := 0; k2 == ""; i++ {
		k := "key-" + string(rune('a'+i%26)) + string(rune('a'+i/26%26)) + string(rune('a'+i/676%26))
		home := tb.hk.hash(k) & tb.mask
		if other, ok := byHome[home]; ok {
			k1, k2 = other, k
		}
		byHome[home] = k
	}
	require.True(t, tb.AllowAt(k1, 10, t0))
	require.True(t, tb.AllowAt(k2, 10, t0))
	h1, h2 := tb.hk.hash(k1), tb.hk.hash(k2)
	require.Equal(t, 0, pos(tb, h1))
	require.Equal(t, 1, pos(tb, h2))

	tb.Forget(k1)
	assert.Equal(t, -1, pos(tb, h1))
	assert.Equal(t, 1, pos(tb, h2), "k2 is still found past the hole")
	assert.False(t, tb.AllowAt(k2, 1, t0), "and still drained")
	assert.Equal(t, 10.0, tb.RemainingAt(k1, t0), "a forgotten key is full")
	tb.Reset(k2)
	assert.Equal(t, 10.0, tb.RemainingAt(k2, t0))
	assert.Equal(t, 1, pos(tb, h2), "Reset keeps the slot")
}

// TestModel runs random operations on random keys with random clock steps
// against a plain map model. Invariants: every decision equals the model's
// (no eviction happens: the table is large enough), at most one slot per
// key, and every TAT ≤ now + τ.
func TestModel(t *testing.T) {
	p := Policy{Limit: 7, Window: time.Second, Burst: 5}
	c, _ := p.canon()
	tb := openTemp(t, p, WithSlots(256))
	r := rand.New(rand.NewPCG(7, 11))
	model := map[string]int64{} // key → tat
	keys := make([]string, 40)
	for i := range keys {
		keys[i] = "m" + string(rune('A'+i))
	}
	now := t0
	for step := range 20000 {
		now += r.Int64N(int64(200 * time.Millisecond))
		k := keys[r.IntN(len(keys))]
		switch op := r.IntN(10); {
		case op < 7:
			cost := 1 + r.Int64N(c.burst)
			tat := max(model[k], now)
			want := tat+cost*c.interval-now <= c.tau()
			if want {
				model[k] = tat + cost*c.interval
			}
			require.Equal(t, want, tb.AllowAt(k, cost, now), "step %d: AllowAt(%s, %d)", step, k, cost)
		case op < 8:
			tb.Forget(k)
			delete(model, k)
		case op < 9:
			tb.Reset(k)
			if _, ok := model[k]; ok {
				model[k] = 0
			}
		default:
			d := max(model[k]-now, 0)
			require.Equal(t, time.Duration(d), tb.ResetAfterAt(k, now), "step %d", step)
		}
	}
	require.Zero(t, tb.Stats().Evicted)
	seen := map[uint64]bool{}
	for i := range uint64(tb.nslots) {
		s := slotAt(tb.slots, i)
		if k := s.key.Load(); k != 0 {
			require.False(t, seen[k], "key in two slots")
			seen[k] = true
		}
		require.LessOrEqual(t, s.tat.Load(), now+c.tau())
	}
}
