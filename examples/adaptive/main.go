// Command adaptive measures httplimit.Adaptive against a simulated upstream
// in virtual time, side by side with a fixed rate, retries alone and plain
// AIMD, and prints the table of docs/adaptive.md; with -svg it also draws
// the limiter's rate against the quota over time.
//
//	go run ./examples/adaptive -svg docs/adaptive.svg
//
// Every run is 15 virtual minutes under sched.Virtual with one seed: the
// same command prints the same table on any machine.
package main

import (
	"flag"
	"fmt"
	"image/color"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/sluice-go/sluice/internal/adaptsim"
)

func main() {
	svg := flag.String("svg", "", "also draw the rate against the quota to this SVG file (a PNG if it ends in .png)")
	seed := flag.Uint64("seed", 1, "the runs' seed")
	callers := flag.String("callers", "1,16", "concurrent callers, comma-separated")
	flag.Parse()
	var ns []int
	for _, f := range strings.Split(*callers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "adaptive: bad -callers %q\n", *callers)
			os.Exit(2)
		}
		ns = append(ns, n)
	}
	wall := time.Now()
	if err := run(os.Stdout, *svg, adaptsim.Scenarios(), ns, *seed); err != nil {
		fmt.Fprintln(os.Stderr, "adaptive:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "adaptive: done in %v of wall time\n", time.Since(wall).Round(time.Millisecond))
}

// run runs every scenario with every mode and count of callers, writes the
// table to w and, if svg is not empty, the picture to that file.
func run(w io.Writer, svg string, scenarios []adaptsim.Scenario, callers []int, seed uint64) error {
	type job struct {
		sc      adaptsim.Scenario
		mode    adaptsim.Mode
		callers int
	}
	var jobs []job
	for _, sc := range scenarios {
		for _, m := range adaptsim.Modes {
			for _, n := range callers {
				jobs = append(jobs, job{sc, m, n})
			}
		}
	}
	results := make([]*adaptsim.Result, len(jobs))
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for i, j := range jobs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			results[i], errs[i] = adaptsim.Run(j.sc, j.mode, j.callers, seed)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}

	fmt.Fprintf(w, "| scenario | client | callers | quota used | 429s | 429s in the first minute | 90%% of the quota after | 90%% of a quota back or risen after |\n")
	fmt.Fprintf(w, "|---|---|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range results {
		fmt.Fprintf(w, "| %s | %s | %d | %.1f%% | %d | %d | %s | %s |\n", r.Scenario, r.Mode, r.Callers,
			100*r.Utilization, r.Refusals, r.FirstMinute, secs(r.Reach90), secs(r.Recovery))
	}
	if svg == "" {
		return nil
	}
	return drawRates(svg, results, callers[0])
}

func secs(d time.Duration) string {
	if d < 0 {
		return "–"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + " s"
}

// drawRates draws, for one count of callers, each scenario's quota and the
// rate Adaptive and plain AIMD set, one panel a scenario.
func drawRates(file string, results []*adaptsim.Result, callers int) error {
	var panels []*plot.Plot
	byScenario := map[string]map[adaptsim.Mode]*adaptsim.Result{}
	var order []string
	for _, r := range results {
		if r.Callers != callers {
			continue
		}
		if byScenario[r.Scenario] == nil {
			byScenario[r.Scenario] = map[adaptsim.Mode]*adaptsim.Result{}
			order = append(order, r.Scenario)
		}
		byScenario[r.Scenario][r.Mode] = r
	}
	for _, name := range order {
		rs := byScenario[name]
		p := plot.New()
		p.Title.Text = name
		p.X.Label.Text = "seconds"
		p.Y.Label.Text = "requests a second"
		p.Legend.Top = true
		p.Add(plotter.NewGrid())
		for _, s := range []struct {
			mode  adaptsim.Mode
			color color.Color
			width float64
		}{
			{adaptsim.AIMD, color.RGBA{B: 200, A: 255}, 1},
			{adaptsim.Adaptive, color.RGBA{R: 200, A: 255}, 1.2},
		} {
			r := rs[s.mode]
			if r == nil {
				continue
			}
			l, err := series(r.Rate, r.Res)
			if err != nil {
				return err
			}
			l.Color, l.Width = s.color, vg.Points(s.width)
			p.Add(l)
			p.Legend.Add(string(s.mode)+": rate", l)
		}
		if r := rs[adaptsim.Adaptive]; r != nil {
			q, err := series(r.Quota, r.Res)
			if err != nil {
				return err
			}
			q.Color, q.Width = color.Black, vg.Points(1.5)
			q.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
			p.Add(q)
			p.Legend.Add("quota", q)
		}
		p.Y.Min, p.Y.Max = 0, 3*adaptsim.Quota
		panels = append(panels, p)
	}
	const cols = 1
	rows := len(panels)
	width, height := 8*vg.Inch, vg.Length(rows)*2.6*vg.Inch
	var c interface {
		vg.CanvasSizer
		io.WriterTo
	} = vgsvg.New(width, height)
	if strings.HasSuffix(file, ".png") {
		c = vgimg.PngCanvas{Canvas: vgimg.New(width, height)}
	}
	dc := draw.New(c)
	t := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Points(4), PadY: vg.Points(8), PadTop: vg.Points(4), PadBottom: vg.Points(4)}
	grid := make([][]*plot.Plot, rows)
	for i, p := range panels {
		grid[i] = []*plot.Plot{p}
	}
	for i, row := range plot.Align(grid, t, dc) {
		grid[i][0].Draw(row[0])
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// series is a line of vs, one value a slot of res, averaged over seconds
// (each point the mean of its second) to keep the file small.
func series[T float64 | int64](vs []T, res time.Duration) (*plotter.Line, error) {
	per := int(time.Second / res)
	xys := make(plotter.XYs, 0, len(vs)/per+1)
	for i := 0; i+per <= len(vs); i += per {
		var sum float64
		for _, v := range vs[i : i+per] {
			sum += float64(v)
		}
		xys = append(xys, plotter.XY{X: float64(i) * res.Seconds(), Y: sum / float64(per)})
	}
	return plotter.NewLine(xys)
}
