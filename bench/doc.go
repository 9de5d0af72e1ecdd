// Package bench holds the benchmarks that compare sluice's limiters with
// their peers (golang.org/x/time/rate, go.uber.org/ratelimit,
// golang.org/x/sync/semaphore, go-chi/httprate, go-redis/redis_rate). It
// is a module of its own so that the peer libraries are never a dependency
// of the library module. The Redis rows start a redis-server of their own
// and are skipped without one. From a checkout:
//
//	cd bench && go test -run '^$' -bench . -count 5 -benchmem .
//
// TestServiceVsPeers, opt-in as it takes minutes, compares the service,
// `sluice serve`, with envoyproxy/ratelimit and gubernator on loopback, all
// driven by one load loop (it builds sluice, installs the peers with go
// install and starts a redis-server):
//
//	SLUICE_PEERS=1 go test -run TestServiceVsPeers -v -count=1 -timeout 30m ./bench
//
// docs/benchmarks.md gives each figure with the command that reproduces it.
package bench
