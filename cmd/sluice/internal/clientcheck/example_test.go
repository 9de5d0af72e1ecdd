package clientcheck_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"time"

	"github.com/sluice-go/sluice/client"
	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/store"
)

// A replica asks the service before each unit of work. Here the service runs
// in-process on loopback with a limit of 1/s and a burst of 3.
func Example() {
	mem := store.NewMemory()
	defer mem.Close()
	srv, _ := service.New(service.Config{Store: mem, Default: store.Policy{Rate: 1, Burst: 3},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ts := httptest.NewServer(srv)
	defer ts.Close()

	c, _ := client.New(ts.URL, client.WithTimeout(time.Second))
	defer c.Close()
	ctx := context.Background()
	for i := 1; i <= 4; i++ {
		d, err := c.Allow(ctx, "tenant-a", 1)
		if err != nil {
			fmt.Println("error:", err)
			continue
		}
		fmt.Printf("request %d: allowed=%v retry in ~%.0fs\n", i, d.Allowed, d.RetryAfter.Seconds())
	}
	// Acquire would wait about a second here; with a shorter deadline it
	// gives up at once instead.
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	fmt.Println(c.Acquire(short, "tenant-a", 1) != nil)
	// Output:
	// request 1: allowed=true retry in ~0s
	// request 2: allowed=true retry in ~0s
	// request 3: allowed=true retry in ~0s
	// request 4: allowed=false retry in ~1s
	// true
}
