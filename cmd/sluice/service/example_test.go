package service_test

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"

	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/store"
)

// Embedding the service in your own program: a memory store, a default of
// one token every 100 s with a burst of 2, and a per-key override parsed from
// -limits syntax.
func Example() {
	limits, err := service.ParseLimits("tenant-b=1:1")
	if err != nil {
		panic(err)
	}
	mem := store.NewMemory()
	defer mem.Close()
	srv, err := service.New(service.Config{
		Store:   mem,
		Default: store.Policy{Rate: 0.01, Burst: 2},
		Limits:  limits,
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		panic(err)
	}
	ts := httptest.NewServer(srv)
	defer ts.Close()

	for _, q := range []string{"key=a", "key=a", "key=a", "key=tenant-b", "key=tenant-b&n=2"} {
		resp, err := http.Get(ts.URL + "/allow?" + q)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusBadRequest:
			fmt.Printf("%-17s %d %s", q, resp.StatusCode, body)
		default:
			fmt.Printf("%-17s %d remaining=%s retry-after=%q\n", q, resp.StatusCode,
				resp.Header.Get("X-RateLimit-Remaining"), resp.Header.Get("Retry-After"))
		}
	}
	// Output:
	// key=a             200 remaining=1 retry-after=""
	// key=a             200 remaining=0 retry-after=""
	// key=a             429 remaining=0 retry-after="100"
	// key=tenant-b      200 remaining=0 retry-after=""
	// key=tenant-b&n=2  400 {"error":"n=2 exceeds the burst 1 of policy \"tenant-b\": it can never be allowed"}
}
