package sched_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/loopctx"
)

// TestLoopOfWrapped: the loop is found through any context wrapper.
func TestLoopOfWrapped(t *testing.T) {
	type key struct{}
	require.False(t, loopctx.InLoop(context.Background()))
	require.NoError(t, runV(func(ctx context.Context) error {
		wrapped, cancel := context.WithCancel(context.WithValue(ctx, key{}, 1))
		defer cancel()
		assert.True(t, loopctx.InLoop(ctx))
		assert.True(t, loopctx.InLoop(wrapped))
		return nil
	}))
}

// TestAfterRun: f runs when the run ends, not when a ctx derived from the
// run's is cancelled, and at once for a run that has ended.
func TestAfterRun(t *testing.T) {
	type key struct{}
	var ran []string
	var saved context.Context
	require.NoError(t, runV(func(ctx context.Context) error {
		c, cancel := context.WithCancel(context.WithValue(ctx, key{}, 1))
		stop := loopctx.AfterRun(c, func() { ran = append(ran, "a") })
		require.NotNil(t, stop)
		cancel()
		unreg := loopctx.AfterRun(ctx, func() { ran = append(ran, "never") })
		assert.True(t, unreg())
		assert.Empty(t, ran)
		saved = c
		return nil
	}))
	assert.Equal(t, []string{"a"}, ran)
	loopctx.AfterRun(saved, func() { ran = append(ran, "late") })
	assert.Equal(t, []string{"a", "late"}, ran)
	assert.Nil(t, loopctx.AfterRun(context.Background(), func() {}))
}
