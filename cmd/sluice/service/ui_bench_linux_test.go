package service_test

import (
	"context"
	"net/http"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/store"
)

// threadCPU is the CPU time the calling OS thread has used, in ns.
func threadCPU(b *testing.B) int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// BenchmarkUICostPaired measures the paths of BenchmarkUICost in one loop,
// alternating batches of 4096 decisions between a server without the
// page's counters and one with them, on one locked OS thread, timing each
// batch by that thread's CPU time: on a shared machine wall time counts
// whatever else ran meanwhile (runs minutes apart differ by far more than
// 5%), CPU time of the thread does not. It reports each one's CPU ns per
// decision and their ratio (on/off):
//
//	go test -run '^$' -bench BenchmarkUICostPaired -count 5 ./service/
func BenchmarkUICostPaired(b *testing.B) {
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
		b.Run(c.name, func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			undo := service.SetUIOff()
			off, offReqs := benchServer(b, c.p, nil)
			undo()
			on, onReqs := benchServer(b, c.p, nil)
			// As in serve: the sampler runs (and keeps the sketch's coarse
			// clock).
			ctx, cancel := context.WithCancel(b.Context())
			done := make(chan struct{})
			go func() { defer close(done); on.RunUI(ctx) }()
			defer func() { cancel(); <-done }()
			w := &discardWriter{h: http.Header{}}
			for i := range offReqs {
				off.ServeHTTP(w, offReqs[i])
				on.ServeHTTP(w, onReqs[i])
			}
			const batch = 4096
			var tOff, tOn int64
			run := func(srv *service.Server, reqs []*http.Request) int64 {
				start := threadCPU(b)
				for j := range batch {
					clear(w.h)
					srv.ServeHTTP(w, reqs[j%c.keys])
					if w.status != c.status {
						b.Fatal(w.status)
					}
				}
				return threadCPU(b) - start
			}
			n := 0
			for i := 0; b.Loop(); i++ {
				if i%2 == 0 { // alternate which goes first
					tOff += run(off, offReqs)
					tOn += run(on, onReqs)
				} else {
					tOn += run(on, onReqs)
					tOff += run(off, offReqs)
				}
				n += batch
			}
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(float64(tOff)/float64(n), "off-cpu-ns/decision")
			b.ReportMetric(float64(tOn)/float64(n), "on-cpu-ns/decision")
			b.ReportMetric(float64(tOn)/float64(tOff), "on/off")
		})
	}
}
