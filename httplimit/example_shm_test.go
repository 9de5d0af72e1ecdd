//go:build linux

package httplimit_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"

	"github.com/sluice-go/sluice/httplimit"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/shmstore"
)

// A host-wide limit: every process that opens the same directory shares the
// buckets (memory-mapped files), so pre-forked workers or several servers on
// one host count against one limit per key. Two stores stand for two
// processes here.
func ExampleNewMiddleware_shm() {
	dir, err := os.MkdirTemp("", "httplimit-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	policy := store.Policy{Rate: 1, Burst: 2}
	var urls []string
	for range 2 { // two "processes"
		st, err := shmstore.Open(dir)
		if err != nil {
			log.Fatal(err)
		}
		defer st.Close()
		limit, err := httplimit.NewMiddleware(st, policy)
		if err != nil {
			log.Fatal(err)
		}
		srv := httptest.NewServer(limit.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
		defer srv.Close()
		urls = append(urls, srv.URL)
	}
	for _, u := range []string{urls[0], urls[1], urls[0], urls[1]} {
		resp, err := http.Get(u)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"))
	}
	// Output:
	// 200 1
	// 200 0
	// 429 0
	// 429 0
}
