package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/adaptsim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A short run of one scenario: a row for each client, the same table for
// the same seed, and an SVG drawn.
func TestRunPrintsTableAndDraws(t *testing.T) {
	sc := adaptsim.Drop(20*time.Second, 20*time.Second)
	sc.Length = time.Minute
	svg := filepath.Join(t.TempDir(), "adaptive.svg")
	var out bytes.Buffer
	require.NoError(t, run(&out, svg, []adaptsim.Scenario{sc}, []int{1}, 1))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 2+len(adaptsim.Modes))
	assert.Contains(t, lines[2], "| 50% drop for 20 s | adaptive | 1 |")

	var again bytes.Buffer
	require.NoError(t, run(&again, "", []adaptsim.Scenario{sc}, []int{1}, 1))
	assert.Equal(t, out.String(), again.String())

	b, err := os.ReadFile(svg)
	require.NoError(t, err)
	assert.Contains(t, string(b[:min(len(b), 200)]), "<svg")
}
