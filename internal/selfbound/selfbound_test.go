package selfbound_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/selfbound"
	"github.com/sluice-go/sluice/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type selfBound = selfbound.Marker

type bounded struct {
	selfBound
	store.Store
}

// A marked store's bound is found directly and through a breaker; unmarked
// stores and nil have none.
func TestOf(t *testing.T) {
	mem := store.NewMemory()
	b := &bounded{Store: mem}
	assert.Zero(t, selfbound.Of(b), "the zero Marker promises nothing")
	selfbound.Set(&b.selfBound, 250*time.Millisecond)
	assert.Equal(t, 250*time.Millisecond, selfbound.Of(b))
	br := store.NewBreaker(b, store.BreakerOptions{})
	t.Cleanup(func() { _ = br.Close() })
	assert.Equal(t, 250*time.Millisecond, selfbound.Of(br))
	assert.Zero(t, selfbound.Of(mem))
	assert.Zero(t, selfbound.Of(nil))
	selfbound.Set(&b.selfBound, -time.Second)
	assert.Zero(t, selfbound.Of(b))
}
