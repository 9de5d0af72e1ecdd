//go:build linux || darwin

package sharedbucket_test

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sluice-go/sluice/sharedbucket"
)

// Every process that opens the same path shares the buckets: here, 3
// requests per second per key with bursts of 3, driven with explicit times.
func Example() {
	dir, _ := os.MkdirTemp("", "sluice-example-")
	defer os.RemoveAll(dir)
	tb, err := sharedbucket.Open(filepath.Join(dir, "api.sbt"),
		sharedbucket.Policy{Limit: 3, Window: time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer tb.Close()

	now := sharedbucket.Now()
	for i := range 4 {
		fmt.Println(i, tb.AllowAt("alice", 1, now))
	}
	fmt.Println("retry after", tb.RetryAfterAt("alice", 1, now).Round(time.Millisecond))
	fmt.Println("later", tb.AllowAt("alice", 1, now+int64(334*time.Millisecond)))
	// Output:
	// 0 true
	// 1 true
	// 2 true
	// 3 false
	// retry after 333ms
	// later true
}

// An Arena keeps one table per policy in a directory (by default a tmpfs
// directory private to the user; see DefaultDir).
func ExampleArena() {
	dir, _ := os.MkdirTemp("", "sluice-example-")
	defer os.RemoveAll(dir)
	arena, err := sharedbucket.NewArena(dir)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer arena.Close()
	login, _ := arena.Rate("login", sharedbucket.Policy{Limit: 5, Window: 5 * time.Minute})
	_, err = arena.Rate("login", sharedbucket.Policy{Limit: 50, Window: 5 * time.Minute})
	fmt.Println(login.Stats().Burst, err != nil)
	// Output: 5 true
}
