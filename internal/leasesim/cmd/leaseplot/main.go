// Command leaseplot runs Doorman's scenario in virtual time (package
// leasesim) and draws shares and demand over time as an SVG:
//
//	go run ./internal/leasesim/cmd/leaseplot -o docs/leases.svg
package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/sluice-go/sluice/internal/leasesim"
)

func main() {
	out := flag.String("o", "leases.svg", "the SVG file to write")
	seed := flag.Uint64("seed", 1, "the scenario's seed")
	length := flag.Duration("length", 30*time.Minute, "virtual time to run")
	flag.Parse()
	cfg := leasesim.Doorman(*seed)
	cfg.Length, cfg.Trace = *length, true
	res, err := leasesim.Run(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "leaseplot:", err)
		os.Exit(1)
	}
	f, err := os.Create(*out)
	if err == nil {
		err = res.SVG(f, pick(res))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "leaseplot:", err)
		os.Exit(1)
	}
	fmt.Printf("%s: %d replicas, %v; bound held: %v (largest window %.0f tokens under it); shares %.2f%% of capacity while demand ≥ capacity; peak %.2f%%\n",
		*out, cfg.Replicas, cfg.Length, res.Excess <= 0, -res.Excess, 100*res.Utilization, 100*res.PeakShares)
}

// pick names three replicas worth watching: the one whose demand peaked
// highest (a spike), the first that died or was cut off, and the one that
// wanted least on average.
func pick(res *leasesim.Result) []int {
	n := res.Config.Replicas
	peak, mean := make([]float64, n), make([]float64, n)
	for _, s := range res.Samples {
		for i, e := range s.Each {
			peak[i] = max(peak[i], e.Demand)
			mean[i] += e.Demand
		}
	}
	var out []int
	add := func(i int) {
		if i >= 0 && !slices.Contains(out, i) {
			out = append(out, i)
		}
	}
	add(argBest(peak, func(a, b float64) bool { return a > b }))
	for _, e := range res.Events {
		if e.Kind == "death" || e.Kind == "partition" {
			add(e.Replica)
			break
		}
	}
	add(argBest(mean, func(a, b float64) bool { return a < b }))
	return out
}

func argBest(v []float64, better func(a, b float64) bool) int {
	best := -1
	for i, x := range v {
		if best < 0 || better(x, v[best]) {
			best = i
		}
	}
	return best
}
