package leasesim

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"time"
)

// SVG draws a traced run (Config.Trace) as an SVG picture: on top the
// total demand of the live replicas, the shares they enforce and what the
// server reserves, against the policy's rate, with the server's restarts
// and outages marked; below, the demand and share of the replicas named.
// It writes by hand (polylines and text): the library's modules stay free
// of plotting packages.
func (r *Result) SVG(w io.Writer, replicas []int) error {
	if len(r.Samples) == 0 {
		return fmt.Errorf("leasesim: SVG: no samples")
	}
	for _, i := range replicas {
		if i < 0 || i >= r.Config.Replicas || r.Samples[0].Each == nil {
			return fmt.Errorf("leasesim: SVG: replica %d not traced (Config.Trace, %d replicas)", i, r.Config.Replicas)
		}
	}
	const (
		width, left, right = 960.0, 60.0, 20.0
		topY, topH         = 40.0, 300.0
		botY, botH         = 400.0, 220.0
		height             = 660.0
	)
	end := r.Samples[len(r.Samples)-1].At
	x := func(at time.Duration) float64 { return left + (width-left-right)*at.Seconds()/end.Seconds() }
	var topMax, botMax float64
	for _, s := range r.Samples {
		topMax = max(topMax, s.Demand, s.Shares, s.Reserved)
		for _, i := range replicas {
			botMax = max(botMax, s.Each[i].Demand, s.Each[i].Share)
		}
	}
	topMax = niceCeil(max(topMax, r.Config.Rate) * 1.05)
	botMax = niceCeil(botMax * 1.05)
	yTop := func(v float64) float64 { return topY + topH*(1-v/topMax) }
	// Why a log scale below: a replica's demand can be thirty times its
	// share (a spike), and both must be readable; values under 1 (a dead
	// replica's zero) sit on the axis.
	yBot := func(v float64) float64 { return botY + botH*(1-math.Log10(max(v, 1))/math.Log10(botMax)) }

	bw := bufio.NewWriter(w)
	p := func(format string, args ...any) { _, _ = fmt.Fprintf(bw, format, args...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	// Mishaps of the server, behind the lines: outages shaded, restarts as
	// thin lines.
	for _, e := range r.Events {
		switch e.Kind {
		case "outage":
			x0, x1 := x(e.At), x(min(e.At+e.For, end))
			p(`<rect x="%.1f" y="%g" width="%.1f" height="%g" fill="#f3d9d9"/>`+"\n", x0, topY, max(x1-x0, 0.5), topH)
		case "restart":
			p(`<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="#b07aa1" stroke-width="1"/>`+"\n", x(e.At), topY, x(e.At), topY+topH)
		}
	}
	axes := func(y0, h, vmax float64, y func(float64) float64, log bool, title string) {
		p(`<text x="%g" y="%g" font-size="14">%s</text>`+"\n", left, y0-12, title)
		var ticks []float64
		if log {
			for e := 1.0; e <= vmax; e *= 10 {
				for _, m := range []float64{1, 2, 5} {
					if m*e <= vmax {
						ticks = append(ticks, m*e)
					}
				}
			}
		} else {
			step := niceStep(vmax / 5)
			for v := 0.0; v <= vmax+step/1e6; v += step {
				ticks = append(ticks, v)
			}
		}
		for _, v := range ticks {
			p(`<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#e5e5e5"/>`+"\n", left, y(v), width-right, y(v))
			p(`<text x="%g" y="%.1f" text-anchor="end">%g</text>`+"\n", left-6, y(v)+4, v)
		}
		mstep := niceStep(end.Minutes() / 8)
		for m := 0.0; m <= end.Minutes()+mstep/1e6; m += mstep {
			at := time.Duration(m * float64(time.Minute))
			p(`<line x1="%.1f" y1="%g" x2="%.1f" y2="%g" stroke="#999"/>`+"\n", x(at), y0+h, x(at), y0+h+4)
			p(`<text x="%.1f" y="%g" text-anchor="middle">%g min</text>`+"\n", x(at), y0+h+18, m)
		}
		p(`<rect x="%g" y="%g" width="%g" height="%g" fill="none" stroke="#999"/>`+"\n", left, y0, width-left-right, h)
	}
	line := func(color string, dash string, widthPx float64, y func(float64) float64, v func(Sample) float64) {
		p(`<polyline fill="none" stroke="%s" stroke-width="%g"`, color, widthPx)
		if dash != "" {
			p(` stroke-dasharray="%s"`, dash)
		}
		p(` points="`)
		// Runs of one value are drawn as their two ends: the shares
		// change at renewals only, so the file stays small.
		n := len(r.Samples)
		for k, s := range r.Samples {
			val := v(s)
			if k > 0 && k < n-1 && v(r.Samples[k-1]) == val && v(r.Samples[k+1]) == val {
				continue
			}
			p("%.1f,%.1f ", x(s.At), y(val))
		}
		p(`"/>` + "\n")
	}
	c := r.Config
	axes(topY, topH, topMax, yTop, false, fmt.Sprintf("%d replicas sharing %g a second: total demand, shares in force, server's reservations (tokens a second)", c.Replicas, c.Rate))
	p(`<line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#d62728" stroke-dasharray="6 4"/>`+"\n", left, yTop(c.Rate), width-right, yTop(c.Rate))
	line("#999999", "", 1.2, yTop, func(s Sample) float64 { return s.Demand })
	line("#ff7f0e", "", 1, yTop, func(s Sample) float64 { return s.Reserved })
	line("#1f77b4", "", 1.4, yTop, func(s Sample) float64 { return s.Shares })
	legend := func(x0, y0, w float64, items [][3]string) {
		p(`<rect x="%g" y="%g" width="%g" height="%d" fill="white" fill-opacity="0.85"/>`+"\n", x0-6, y0-10, w, 16*len(items)+4)
		for k, it := range items {
			yy := y0 + float64(k)*16
			p(`<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="%s" stroke-width="2" stroke-dasharray="%s"/>`, x0, yy, x0+22, yy, it[0], it[1])
			p(`<text x="%g" y="%g">%s</text>`+"\n", x0+28, yy+4, it[2])
		}
	}
	legend(left+10, topY+16, 330, [][3]string{
		{"#999999", "", "total demand"},
		{"#1f77b4", "", "shares in force at the replicas"},
		{"#ff7f0e", "", "reserved by the server"},
		{"#d62728", "6 4", fmt.Sprintf("policy rate %g", c.Rate)},
		{"#f3d9d9", "", "server unreachable (shaded); restarts: purple lines"},
	})
	colors := []string{"#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf"}
	axes(botY, botH, botMax, yBot, true, "single replicas: demand (dashed) and share in force (solid), log scale")
	var items [][3]string
	for k, i := range replicas {
		col := colors[k%len(colors)]
		line(col, "4 3", 1, yBot, func(s Sample) float64 { return s.Each[i].Demand })
		line(col, "", 1.4, yBot, func(s Sample) float64 { return s.Each[i].Share })
		items = append(items, [3]string{col, "", fmt.Sprintf("replica %d", i)})
	}
	legend(width-right-110, yBot(80), 110, items)
	p("</svg>\n")
	return bw.Flush()
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10} {
		if m*e >= v {
			return m * e
		}
	}
	return 10 * e
}

// niceStep is a tick spacing near v: 1, 2 or 5 times a power of ten.
func niceStep(v float64) float64 {
	if v <= 0 {
		return 1
	}
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*e >= v {
			return m * e
		}
	}
	return 10 * e
}
