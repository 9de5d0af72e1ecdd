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

// A marked store's bound is found; a wrapper of it (looked through by the
// caller, not here), a zero Marker and nil promise none.
func TestOf(t *testing.T) {
	mem := store.NewMemory()
	b := &bounded{Store: mem}   // a breaker's Close closes it
	assertBound(t, b, 0, false) // the zero Marker promises nothing
	selfbound.Set(&b.selfBound, 250*time.Millisecond)
	assertBound(t, b, 250*time.Millisecond, true)
	br := store.NewBreaker(b, store.BreakerOptions{})
	t.Cleanup(func() { _ = br.Close() })
	assertBound(t, br, 0, false) // a wrapper is the caller's to look through
	assertBound(t, nil, 0, false)
	selfbound.Set(&b.selfBound, -time.Second)
	assertBound(t, b, 0, false)
}

func assertBound(t *testing.T, s any, want time.Duration, wantOK bool) {
	t.Helper()
	d, ok := selfbound.Of(s)
	assert.Equal(t, wantOK, ok, "%T promises a bound", s)
	assert.Equal(t, want, d, "%T's bound", s)
}
