package bench_test

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/go-chi/httprate"

	"github.com/sluice-go/sluice/httplimit"
	"github.com/sluice-go/sluice/store"
)

// BenchmarkMiddleware measures what a limit adds to a bare handler, per
// allowed request, for one client IP and for 1000 (rotating): bare is the
// handler alone, sluice the httplimit middleware over store.Memory, httprate
// go-chi/httprate's LimitBy keyed by the peer's address (its in-memory
// sliding-window counter), the peer baseline, in the same run. Every request is allowed: the
// limits are far above the benchmark's pace. Overhead = mw − bare.
func BenchmarkMiddleware(b *testing.B) {
	bare := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mem := store.NewMemory()
	b.Cleanup(func() { _ = mem.Close() })
	sluice, err := httplimit.NewMiddleware(mem, store.Policy{Rate: 1e9, Burst: 200})
	if err != nil {
		b.Fatal(err)
	}
	handlers := []struct {
		name string
		h    http.Handler
	}{
		{"bare", bare},
		{"sluice", sluice.Handler(bare)},
		{"httprate", httprate.LimitBy(1<<30, time.Minute, keyByPeer)(bare)},
	}
	for _, keys := range []int{1, 1000} {
		reqs := make([]*http.Request, keys)
		for i := range reqs {
			reqs[i] = httptest.NewRequest(http.MethodGet, "/", nil)
			reqs[i].RemoteAddr = "10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256) + ":4711"
		}
		for _, h := range handlers {
			b.Run(h.name+"/keys="+strconv.Itoa(keys), func(b *testing.B) {
				w := &nopWriter{h: http.Header{}}
				for _, r := range reqs { // first sight of each key is not the steady state
					h.h.ServeHTTP(w, r)
				}
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					h.h.ServeHTTP(w, reqs[i])
					if i++; i == keys {
						i = 0
					}
				}
			})
		}
	}
}

// keyByPeer keys httprate by the connection's peer address, as httplimit does
// by default: the work of httprate's LimitByIP, which is deprecated because
// a proxy's clients share its address. (chi's ClientIPFromRemoteAddr, the
// replacement its notice names, would add a middleware and a context value
// per request that the sluice row does not pay.)
func keyByPeer(r *http.Request) (string, error) {
	ip, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		ip = r.RemoteAddr
	}
	return httprate.CanonicalizeIP(ip), nil
}

type nopWriter struct{ h http.Header }

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *nopWriter) WriteHeader(int)             {}
