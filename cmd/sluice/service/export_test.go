package service

// WholeSecondsUp is wholeSecondsUp, for the external tests.
var WholeSecondsUp = wholeSecondsUp

// SpaceSaving exposes the heavy-hitters summary to the external tests.
type SpaceSaving = spaceSaving

func (s *SpaceSaving) Add(key string) {
	if !s.incr(key) {
		s.add(key)
	}
}

// HeavyAdd counts key in a fresh heavyHitters and returns the allocations
// of counting it again (tracked).
func HeavyAllocsTracked(key string, runs int, allocs func(int, func()) float64) float64 {
	h := newHeavyHitters()
	h.add(1, key)
	return allocs(runs, func() { h.add(1, key) })
}

// Top returns the summary's keys as one window would.
func (s *SpaceSaving) Top(limit int) ([]HeavyKey, uint64) {
	w := heavyWindows{}
	w.init(1, 1)
	w.epoch[0], w.sum[0] = 0, *s
	return w.top(0, limit)
}

// SetUIOff makes later New calls build Servers without the page's counters
// (for BenchmarkUICost's baseline); it returns the undo.
func SetUIOff() (undo func()) { uiOff = true; return func() { uiOff = false } }
