package sched

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// On the Go release the module is built with, the layout check passes: a
// release that moves context's fields turns this red before anyone sees
// waits on standard contexts grow slow.
func TestLinkLayoutRecognized(t *testing.T) {
	require.True(t, link.ok, "linkInit rejected this Go release's context layout")
}

// Which standard contexts link to a registration of a loop context, and
// which are settled by checking.
func TestLinkedAfterFuncFindsDirectChildrenOnly(t *testing.T) {
	require.NoError(t, Run(context.Background(), func(ctx context.Context) error {
		type key struct{}
		lctx, cancelL := WithTimeout(ctx, time.Hour)
		defer cancelL()
		direct, cancel1 := context.WithCancel(ctx)
		defer cancel1()
		timed, cancel2 := context.WithTimeout(lctx, time.Hour)
		defer cancel2()
		wrapped := context.WithValue(timed, key{}, 1)
		deep, cancel3 := context.WithCancel(direct)
		defer cancel3()
		detached, cancel4 := context.WithCancel(context.WithoutCancel(ctx))
		defer cancel4()
		for _, c := range []context.Context{direct, timed, wrapped} {
			a := linkedAfterFunc(c)
			if assert.NotNil(t, a, "%v", c) {
				assert.True(t, a.listed)
			}
		}
		assert.Same(t, lctx.(*loopCtx), linkedAfterFunc(timed).c)
		for _, c := range []context.Context{deep, detached, ctx, lctx, context.Background()} {
			assert.Nil(t, linkedAfterFunc(c), "%v", c)
		}
		return nil
	}, Virtual(time.Time{})))
}
