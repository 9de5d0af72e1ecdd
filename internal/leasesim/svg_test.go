package leasesim_test

import (
	"bytes"
	"encoding/xml"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/leasesim"
)

// A traced run draws as well-formed SVG: the three totals, the policy's
// line, and a demand and a share line per replica named; an untraced run,
// or a replica out of range, is an error naming it.
func TestSVG(t *testing.T) {
	cfg := leasesim.Doorman(1)
	cfg.Replicas, cfg.Rate, cfg.Burst, cfg.Length, cfg.Trace = 5, 50, 50, 3*time.Minute, true
	res, err := leasesim.Run(cfg)
	require.NoError(t, err)
	require.NotEmpty(t, res.Samples)
	require.Len(t, res.Samples[0].Each, 5)
	var buf bytes.Buffer
	require.NoError(t, res.SVG(&buf, []int{0, 3}))
	polylines := 0
	d := xml.NewDecoder(&buf)
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			polylines++
			for _, a := range se.Attr {
				if a.Name.Local == "points" {
					assert.GreaterOrEqual(t, len(strings.Fields(a.Value)), 2)
				}
			}
		}
	}
	assert.Equal(t, 3+2*2, polylines)

	err = res.SVG(io.Discard, []int{5})
	require.ErrorContains(t, err, "replica 5")
	cfg.Trace = false
	res, err = leasesim.Run(cfg)
	require.NoError(t, err)
	require.ErrorContains(t, res.SVG(io.Discard, []int{0}), "not traced")
}
