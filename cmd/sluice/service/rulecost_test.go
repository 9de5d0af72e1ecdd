package service_test

import (
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
	"github.com/sluice-go/sluice/store"
)

// manyRules returns a rules file of n rules in one domain, each keyed on
// its own value, with limits that vary the way a generated file's do: the
// units second to day and requests_per_unit 1 to 997, so most rules have a
// (rate, burst) of their own and a rate with no short whole window (7 a
// day is 7 per 86,400 s). gen varies the limits between calls, as a reload
// of an edited file would.
func manyRules(n, gen int) []byte {
	units := []string{"second", "minute", "hour", "day"}
	var b strings.Builder
	b.WriteString("domain: http\ndescriptors:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - key: key\n    value: k%d\n    rate_limit: {unit: %s, requests_per_unit: %d}\n",
			i, units[(i+gen)%len(units)], (i*7+gen)%997+1)
	}
	return []byte(b.String())
}

// ruleCost loads an n-rule file into a new Server (parse and compile, as
// `serve` does at start) and returns the heap it retains per rule (live
// bytes after a GC, less the live bytes before), and the CPU time (wall
// time where CPU time is not measured) and wall time it took per rule.
func ruleCost(t testing.TB, n int) (bytesPerRule float64, cpu, wall time.Duration) {
	data := manyRules(n, 0)
	mem := store.NewMemory()
	defer mem.Close()
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.HeapAlloc
	cpu0, cpuOK := processCPU()
	start := time.Now()
	c, err := rules.ParseAll([]rules.Source{{Name: "rules.yaml", Data: data}}, rules.Options{})
	require.NoError(t, err)
	srv, err := service.New(service.Config{Store: mem, Default: store.Policy{Rate: 10, Burst: 10},
		Rules: c, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	wall = time.Since(start)
	cpu = wall
	if cpu1, _ := processCPU(); cpuOK {
		cpu = time.Duration(cpu1 - cpu0)
	}
	data = nil
	runtime.GC()
	runtime.ReadMemStats(&ms)
	after := ms.HeapAlloc
	runtime.KeepAlive(srv)
	return float64(int64(after)-int64(before)) / float64(n), cpu / time.Duration(n), wall / time.Duration(n)
}

// Per-rule bounds TestRuleCostBound holds a rules load to: the goal is
// 2 KiB and 20 µs a rule (the 8 MiB file cap, some 115,000 rules, in about
// 250 MB and 2 s); the bounds leave room for a loaded machine.
const (
	maxBytesPerRule = 4 << 10
	maxCPUPerRule   = 100 * time.Microsecond
)

// TestRuleCostBound: loading a rules file retains at most maxBytesPerRule
// and takes at most maxCPUPerRule of CPU per rule (not checked under the
// race detector). Header text and metric series wait for a rule's first
// decision.
func TestRuleCostBound(t *testing.T) {
	const n = 5000
	b, cpu, wall := ruleCost(t, n)
	t.Logf("%d rules: %.0f B/rule retained, %v CPU/rule, %v wall/rule", n, b, cpu, wall)
	assert.LessOrEqual(t, b, float64(maxBytesPerRule), "bytes retained per rule")
	if !raceEnabled {
		assert.LessOrEqual(t, cpu, maxCPUPerRule, "CPU per rule to parse and compile")
	}
}

// TestRuleCostMeasure prints what a rule costs at a few sizes; it asserts
// nothing (TestRuleCostBound does). Run it with
//
//	go test -run TestRuleCostMeasure -v -count=1 ./service/
func TestRuleCostMeasure(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("measurement")
	}
	for _, n := range []int{1000, 10000, 30000, 95000} {
		b, cpu, wall := ruleCost(t, n)
		t.Logf("%6d rules (%4.1f MiB): %6.0f B/rule retained, %v CPU/rule, %v wall/rule to parse and compile",
			n, float64(len(manyRules(n, 0)))/(1<<20), b, cpu, wall)
	}
}
