package service_test

import (
	"net/http"
	"testing"

	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/store"
)

// BenchmarkUICost is one /allow decision on the memory store through
// discardWriter, with the page's counters (ui=on: an atomic add per
// decision, and on a denial the heavy-hitters sketch) and without them
// (ui=off), in one run, so the two can be compared:
//
//	go test -run '^$' -bench BenchmarkUICost -count 5 -benchmem ./service/
//
// denied-16keys denies 16 keys over and over (all tracked by the sketch:
// the steady state under a few abusive clients); denied-1024keys cycles
// through more keys than the sketch has counters, so every denial takes a
// counter over and stores a copy of its key (the worst case).
func BenchmarkUICost(b *testing.B) {
	for _, c := range []struct {
		name   string
		p      store.Policy
		status int
		keys   int
	}{
		{"allowed", store.Policy{Rate: 1e6, Burst: 1e6}, http.StatusOK, 1024},
		{"denied-16keys", store.Policy{Rate: 1.0 / 3600, Burst: 1}, http.StatusTooManyRequests, 16},
		{"denied-1024keys", store.Policy{Rate: 1.0 / 3600, Burst: 1}, http.StatusTooManyRequests, 1024},
	} {
		for _, on := range []bool{false, true} {
			name := c.name + "/ui=off"
			if on {
				name = c.name + "/ui=on"
			}
			b.Run(name, func(b *testing.B) {
				if !on {
					defer service.SetUIOff()()
				}
				srv, reqs := benchServer(b, c.p, nil)
				for _, r := range reqs {
					srv.ServeHTTP(&discardWriter{h: http.Header{}}, r)
				}
				w := &discardWriter{h: http.Header{}}
				b.ReportAllocs()
				for i := 0; b.Loop(); i++ {
					clear(w.h)
					srv.ServeHTTP(w, reqs[i%c.keys])
					if w.status != c.status {
						b.Fatal(w.status)
					}
				}
			})
		}
	}
}
