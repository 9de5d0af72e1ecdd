// Package bench holds the benchmarks that compare sluice's limiters with
// their peers (golang.org/x/time/rate, go.uber.org/ratelimit,
// golang.org/x/sync/semaphore, go-chi/httprate, go-redis/redis_rate). It
// is a module of its own so that the peer libraries are never a dependency
// of the library module. The Redis rows start a redis-server of their own
// and are skipped without one. From a checkout:
//
//	cd bench && go test -run '^$' -bench . -count 5 -benchmem .
//
// docs/benchmarks.md gives each figure with the command that reproduces it.
package bench
