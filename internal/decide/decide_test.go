package decide_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/decide"
	"github.com/sluice-go/sluice/internal/selfbound"
	"github.com/sluice-go/sluice/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeStore answers Allow with err when it is set, else allowed; it records
// whether the call's context had a deadline.
type fakeStore struct {
	err         error
	hadDeadline bool
}

func (f *fakeStore) Allow(ctx context.Context, _ string, _ int64, _ store.Policy) (store.Result, error) {
	_, f.hadDeadline = ctx.Deadline()
	if f.err != nil {
		return store.Result{}, f.err
	}
	return store.Result{Allowed: true, Remaining: 1}, nil
}
func (f *fakeStore) Keys(context.Context) (int64, error) { return 0, nil }
func (f *fakeStore) Ping(context.Context) error          { return nil }
func (f *fakeStore) Name() string                        { return "fake" }
func (f *fakeStore) Close() error                        { return nil }

var p = store.Policy{Name: "p", Rate: 1, Burst: 1}

func allow(g *decide.Gate, ctx context.Context, cost int64) decide.Decision {
	var d decide.Decision
	g.Allow(ctx, "k", cost, p, &d)
	return d
}

// Each outage is logged and reported once when it starts and once when it
// ends, whatever the fail mode (the zero FailMode is open), with the
// caller's prefix and the store's error.
func TestOutageChangesOncePerEdge(t *testing.T) {
	for _, mode := range []store.FailMode{0, store.FailOpen, store.FailClosed} {
		f := &fakeStore{}
		var buf bytes.Buffer
		var edges []error
		g := decide.New(decide.Config{Store: f, Timeout: time.Second, Fail: mode,
			Log: slog.New(slog.NewTextHandler(&buf, nil)), LogPrefix: "test: ",
			OnOutage: func(err error) { edges = append(edges, err) }})
		d := allow(g, t.Context(), 1)
		assert.Equal(t, decide.Decision{Result: store.Result{Allowed: true, Remaining: 1}, Allowed: true}, d)
		assert.True(t, f.hadDeadline, "a store that does I/O is bounded")

		f.err = errors.New("down")
		for i, want := range []decide.Change{decide.Failing, decide.Steady, decide.Steady} {
			d = allow(g, t.Context(), 1)
			assert.Equal(t, decide.Degraded, d.Outcome, i)
			assert.Equal(t, want, d.Change, i)
			assert.Equal(t, mode != store.FailClosed, d.Allowed, "the fail mode answers")
			assert.Equal(t, f.err, d.Err)
		}
		down := f.err
		f.err = nil
		assert.Equal(t, decide.Recovered, allow(g, t.Context(), 1).Change)
		assert.Equal(t, decide.Steady, allow(g, t.Context(), 1).Change)

		assert.Equal(t, []error{down, nil}, edges, "OnOutage at each edge, once")
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		require.Len(t, lines, 2, buf.String())
		wantFail := "open"
		if mode == store.FailClosed {
			wantFail = "closed"
		}
		assert.Contains(t, lines[0], `level=ERROR msg="test: store failing; answering per the fail mode" store=fake err=down fail=`+wantFail)
		assert.Contains(t, lines[1], `level=INFO msg="test: store recovered" store=fake`)
	}
}

func TestGoneAndRefusedLeaveTheOutageState(t *testing.T) {
	f := &fakeStore{err: context.Canceled}
	g := decide.New(decide.Config{Store: f, Fail: store.FailOpen, Log: slog.New(slog.DiscardHandler)})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	d := allow(g, ctx, 1)
	assert.Equal(t, decide.Gone, d.Outcome, "the caller left")
	assert.False(t, d.Allowed)
	assert.False(t, f.hadDeadline, "no timeout: no bound")

	f.err = store.ErrCostExceedsBurst
	d = allow(g, t.Context(), 2)
	assert.Equal(t, decide.Refused, d.Outcome)
	assert.ErrorIs(t, d.Err, store.ErrCostExceedsBurst)
	assert.False(t, d.Allowed)

	f.err = errors.New("down")
	assert.Equal(t, decide.Failing, allow(g, t.Context(), 1).Change, "neither counted as an outage")
}

func TestInProcessStoreIsNotBounded(t *testing.T) {
	mem := store.NewMemory()
	t.Cleanup(func() { _ = mem.Close() })
	g := decide.New(decide.Config{Store: mem, Timeout: time.Second, Timed: true})
	d := allow(g, t.Context(), 1)
	require.Equal(t, decide.Decided, d.Outcome)
	assert.True(t, d.Allowed)
	assert.Positive(t, d.Latency, "Timed measures the call")
	assert.Zero(t, allow(g, t.Context(), 1).Allowed, "the burst is spent")
}

type selfBound = selfbound.Marker

//lint:ignore U1000 used through selfbound.Of's interface, which staticcheck cannot follow across packages
type inProcess = selfbound.InProcess

// inProcessStore is a fakeStore marked in-process.
type inProcessStore struct {
	//lint:ignore U1000 used through selfbound.Of's interface, which staticcheck cannot follow across packages
	inProcess
	*fakeStore
}

// An in-process store gets no context deadline from the gate, whatever the
// timeout, alone or behind a breaker.
func TestInProcessStoreGetsNoDeadline(t *testing.T) {
	f := &inProcessStore{fakeStore: &fakeStore{}}
	br := store.NewBreaker(f, store.BreakerOptions{})
	t.Cleanup(func() { _ = br.Close() })
	for _, s := range []store.Store{f, br} {
		g := decide.New(decide.Config{Store: s, Timeout: time.Second, Timed: true})
		d := allow(g, t.Context(), 1)
		require.Equal(t, decide.Decided, d.Outcome)
		assert.False(t, f.hadDeadline, "%T", s)
	}
}

// boundedStore is a fakeStore that promises to bound each call itself.
type boundedStore struct {
	selfBound
	*fakeStore
}

// A store that bounds its own calls within the timeout gets no context
// deadline from the gate (its bound is the tighter); one whose bound is
// looser, or that promises none, does; and so does one behind a breaker,
// which the gate looks through.
func TestSelfBoundStoreWithinTimeoutIsNotBounded(t *testing.T) {
	for _, c := range []struct {
		bound, timeout time.Duration
		deadline       bool
	}{
		{250 * time.Millisecond, 250 * time.Millisecond, false},
		{100 * time.Millisecond, time.Second, false},
		{time.Second, 250 * time.Millisecond, true},
		{0, time.Second, true},
	} {
		f := &boundedStore{fakeStore: &fakeStore{}}
		selfbound.Set(&f.selfBound, c.bound)
		br := store.NewBreaker(f, store.BreakerOptions{})
		for _, s := range []store.Store{f, br} {
			g := decide.New(decide.Config{Store: s, Timeout: c.timeout, Timed: true})
			d := allow(g, t.Context(), 1)
			require.Equal(t, decide.Decided, d.Outcome)
			assert.Equal(t, c.deadline, f.hadDeadline, "bound %v, timeout %v, %T", c.bound, c.timeout, s)
		}
		require.NoError(t, br.Close())
	}
}

// TestAllowAllocs: the gate adds no allocation to a decision over an
// in-process store.
func TestAllowAllocs(t *testing.T) {
	mem := store.NewMemory()
	t.Cleanup(func() { _ = mem.Close() })
	g := decide.New(decide.Config{Store: mem, Timed: true})
	ctx := t.Context()
	allow(g, ctx, 1)
	var d decide.Decision
	assert.Zero(t, testing.AllocsPerRun(100, func() { g.Allow(ctx, "k", 1, p, &d) }))
}
