package httplimit_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/sluice-go/sluice/httplimit"
	"github.com/sluice-go/sluice/ratelimiter"
	"github.com/sluice-go/sluice/store"
)

// A per-IP limit over the in-process memory store: one request a second per
// client IP, bursts of 2. The third request at once is refused.
func ExampleNewMiddleware() {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })

	limit, err := httplimit.NewMiddleware(store.NewMemory(), store.Policy{Rate: 1, Burst: 2})
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(limit.Handler(mux)) // or http.ListenAndServe(addr, limit.Handler(mux))
	defer srv.Close()

	for range 3 {
		resp, err := http.Get(srv.URL)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d RateLimit: %s Retry-After: %q\n  %.16s…\n", resp.StatusCode, resp.Header.Get("RateLimit"),
			resp.Header.Get("Retry-After"), strings.TrimSpace(string(body)))
	}
	// Output:
	// 200 RateLimit: "default";r=1;t=1 Retry-After: ""
	//   hello…
	// 200 RateLimit: "default";r=0;t=1 Retry-After: ""
	//   hello…
	// 429 RateLimit: "default";r=0;t=1 Retry-After: "1"
	//   {"allowed":false…
}

// An http.Client that never sends faster than 20 requests a second, and
// backs off when the server says so.
func ExampleTransport() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") }))
	defer api.Close()

	limiter, err := ratelimiter.New(context.Background(), 20, 1)
	if err != nil {
		log.Fatal(err)
	}
	defer limiter.Stop()
	client := &http.Client{Transport: httplimit.Transport(http.DefaultTransport, limiter)}

	for range 3 {
		resp, err := client.Get(api.URL)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, string(body))
	}
	// Output:
	// 200 ok
	// 200 ok
	// 200 ok
}
