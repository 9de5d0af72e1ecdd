// Package bench holds the benchmarks that compare sluice's limiters with
// their peers (golang.org/x/time/rate, go.uber.org/ratelimit,
// go-chi/httprate). It is a module of its own so that the peer libraries
// are never a dependency of the library module. From a checkout:
//
//	cd bench && go test -run '^$' -bench . -count 5 -benchmem .
//
// docs/benchmarks.md gives each figure with the command that reproduces it.
package bench
