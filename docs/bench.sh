#!/bin/sh
# Reproduces every figure in docs/benchmarks.md, each with its same-run
# baseline. Run from the root of a checkout (go.work names the modules):
# docs/bench.sh [OUTDIR]. Needs redis-server for the Redis rows (skipped
# without it). Run it on a quiet machine and compare ratios.
set -eu
out=${1:-bench-out}
mkdir -p "$out"
{
  date -u '+date: %Y-%m-%d %H:%M UTC'
  echo "go: $(go version)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ //') ($(nproc) CPUs)"
  echo "load: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
  command -v redis-server >/dev/null && redis-server --version
} | tee "$out/machine.txt"
run() { name=$1; shift; echo "== $name: $*"; "$@" 2>&1 | tee "$out/$name.txt"; }
# The token bucket, the semaphore and the shared-memory table against their
# peers (x/time/rate, go.uber.org/ratelimit, x/sync/semaphore, go-chi/httprate),
# from the bench module.
run peers go test -run '^$' -bench . -count 5 -benchmem ./bench
# The library's own benchmarks (fibers, virtual time, a buffered channel).
run ratelimiter go test -run '^$' -bench . -count 5 -benchmem ./ratelimiter ./semaphore
# The run loop against goroutines handing off and bare coroutine resumes.
run sched go test -run '^$' -bench . -count 5 -benchmem ./sched
# The shared-memory table: coarse clock, decisions, hash, Stats.
run sharedbucket go test -run '^$' -bench . -count 5 -benchmem ./sharedbucket
# The stores alone (the memory store against its map-and-mutex predecessor),
# the /allow and ShouldRateLimit handlers without the network.
run stores go test -run '^$' -bench 'Allow|Memory|ShouldRateLimit' -count 5 -benchmem ./cmd/sluice/service/ ./store/...
# /allow over real HTTP on loopback against a bare net/http server, same run.
run loopback go test -run '^$' -bench Loopback -benchtime 20000x -count 5 -benchmem ./cmd/sluice/internal/cli
# sluice serve over loopback at 5k req/s and at peak, against a bare
# net/http server in the same run, in 5 interleaved rounds.
run load env SLUICE_LOADTEST=1 go test -count=1 -run TestServiceLoad -v ./internal/loadgen
# Decisions while Redis is down (killed by the test) and the time to recover.
run outage go test -count=1 -run TestRedisOutageCostsMilliseconds -v ./cmd/sluice
# Decisions per second and p50/p99 over gRPC against the HTTP API, same serve.
run grpc env SLUICE_MEASURE=1 SLUICE_MEASURE_SECS=5 SLUICE_MEASURE_STORES=memory,shm,redis \
  go test -count=1 -run MeasureGRPCvsHTTP -v -timeout 10m ./cmd/sluice
# A decision under a lease against a local limiter and against /allow and
# ShouldRateLimit round trips, 5 passes of every row.
go test -c -o bench.test ./bench
run lease sh -c 'cd bench && for i in 1 2 3 4 5; do ../bench.test -test.run "^\$" -test.bench "Lease/" -test.benchtime 300ms -test.benchmem; done'
# Server CPU per million decisions of 8 replicas, leases against /allow.
run lease-cpu env SLUICE_MEASURE=1 go test -run MeasureLeaseServerCPU -v -count=1 ./cmd/sluice
# sluice serve against envoyproxy/ratelimit and gubernator, one load loop
# for all, from the bench module (installs the peers on its first run).
run service-peers env SLUICE_PEERS=1 go test -run TestServiceVsPeers -v -count=1 -timeout 30m ./bench
date -u '+done: %Y-%m-%d %H:%M UTC' | tee -a "$out/machine.txt"
