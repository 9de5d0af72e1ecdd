//go:build !linux && !darwin

package sharedbucket

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestUnsupported: where tables cannot work, Open and NewArena say so with
// an error wrapping errors.ErrUnsupported; a bad policy is still named.
func TestUnsupported(t *testing.T) {
	_, err := Open(filepath.Join(t.TempDir(), "x.sbt"), Policy{Limit: 1, Window: time.Second})
	require.ErrorIs(t, err, errors.ErrUnsupported)
	_, err = NewArena(t.TempDir())
	require.ErrorIs(t, err, errors.ErrUnsupported)
	_, err = Open("x.sbt", Policy{})
	assert.ErrorContains(t, err, "Policy.Limit = 0")
}
