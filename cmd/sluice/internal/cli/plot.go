package cli

import (
	"fmt"
	"image/color"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// plotDemo draws each replica's allowed requests over time, their sum, and
// the limit line rate·t + burst, to file (format from its extension: .svg,
// .png, .pdf …). start is the instant the replicas started; elapsed the
// run's length.
// checkPlotFile reports whether file names a format plotDemo draws.
func checkPlotFile(file string) error {
	switch strings.ToLower(filepath.Ext(file)) {
	case ".svg", ".png", ".pdf":
		return nil
	}
	return fmt.Errorf("%s: the plot is drawn as .svg, .png or .pdf, chosen by the file's extension", file)
}

func plotDemo(file string, results []ReplicaStats, start time.Time, elapsed time.Duration, rate float64, burst int64) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%d replicas share one limit of %g/s, burst %d", len(results), rate, burst)
	p.X.Label.Text = "seconds"
	p.Y.Label.Text = "requests allowed so far"
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())

	end := elapsed.Seconds()
	limit := plotter.XYs{{X: 0, Y: float64(burst)}, {X: end, Y: rate*end + float64(burst)}}
	ll, err := plotter.NewLine(limit)
	if err != nil {
		return err
	}
	ll.Color = color.Black
	ll.Width = vg.Points(1.5)
	ll.Dashes = []vg.Length{vg.Points(6), vg.Points(4)}
	p.Add(ll)
	p.Legend.Add(fmt.Sprintf("the limit: %g/s × t + %d", rate, burst), ll)

	var all []time.Duration
	for i := range results {
		all = append(all, results[i].AllowedAt...)
		l, err := stepLine(results[i].AllowedAt, end)
		if err != nil {
			return err
		}
		l.Color = plotutil.Color(i + 1) // 0 is red, kept for the sum
		l.Width = vg.Points(1)
		p.Add(l)
		p.Legend.Add(results[i].ID, l)
	}
	slices.Sort(all)
	sum, err := stepLine(all, end)
	if err != nil {
		return err
	}
	sum.Color = color.RGBA{R: 200, A: 255}
	sum.Width = vg.Points(2.5)
	p.Add(sum)
	p.Legend.Add("all replicas", sum)
	p.X.Min, p.X.Max, p.Y.Min = 0, end, 0
	p.Y.Tick.Marker = plainTicks{}
	return p.Save(7*vg.Inch, 4.5*vg.Inch, file)
}

// stepLine is the count of allowed requests over time: a step up at each
// offset (sorted, from the start), held until end.
func stepLine(at []time.Duration, end float64) (*plotter.Line, error) {
	xys := make(plotter.XYs, 0, len(at)+2)
	xys = append(xys, plotter.XY{})
	for i, d := range at {
		xys = append(xys, plotter.XY{X: d.Seconds(), Y: float64(i + 1)})
	}
	xys = append(xys, plotter.XY{X: end, Y: float64(len(at))})
	l, err := plotter.NewLine(xys)
	if err != nil {
		return nil, err
	}
	l.StepStyle = plotter.PostStep
	return l, nil
}

// plainTicks labels ticks as plain numbers ("50", not "50.00"): the axis
// counts requests.
type plainTicks struct{}

func (plainTicks) Ticks(min, max float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(min, max)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = strconv.FormatFloat(ticks[i].Value, 'f', -1, 64)
		}
	}
	return ticks
}
