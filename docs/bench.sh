#!/bin/sh
# Runs every command of docs/benchmarks.md, in the page's order, and keeps
# each one's output in OUTDIR (default bench-out), with benchstat's medians
# beside the raw samples. Run from the root of a checkout (go.work names the
# modules): docs/bench.sh [OUTDIR]. benchstat is the version bench/tools/go.mod
# pins (a module of its own, so its requirements move no version the
# workspace builds with); nothing is fetched @latest. The Redis rows need
# redis-server and are skipped, saying so, without it. Run it on a quiet
# machine and compare ratios.
#
# A benchmark with N samples runs as N passes of -count 1, each pass running
# every row once: a row and its baseline alternate, so one burst of load
# cannot skew one side (go test -count N would run one row N times, then the
# next).
set -eu
out=${1:-bench-out}
mkdir -p "$out"
{
  date -u '+date: %Y-%m-%d %H:%M UTC'
  echo "go: $(go version)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ //') ($(nproc) CPUs)"
  echo "load: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)"
  if command -v redis-server >/dev/null; then redis-server --version; else echo "redis-server: not found, Redis rows skipped"; fi
} | tee "$out/machine.txt"
redis=$(command -v redis-server >/dev/null && echo yes || echo no)

benchstat() { GOWORK=off go tool -modfile=bench/tools/go.mod benchstat "$@"; }
# run NAME CMD...: one command, its output kept.
run() { name=$1; shift; echo "== $name: $*"; "$@" 2>&1 | tee "$out/$name.txt"; }
# passes N NAME GO-TEST-ARGS...: N passes of `go test ARGS` (no -count),
# then benchstat over the N samples of each row.
passes() {
  n=$1; name=$2; shift 2
  : >"$out/$name.txt"
  i=0
  while [ "$i" -lt "$n" ]; do
    i=$((i + 1))
    echo "== $name, pass $i of $n: go test $*"
    go test "$@" 2>&1 | tee -a "$out/$name.txt"
  done
  benchstat "$out/$name.txt" | tee "$out/$name.benchstat.txt"
}
# binpasses N NAME ARGS...: N passes of the bench module's test binary, run
# in bench/ (built once), then benchstat.
binpasses() {
  n=$1; name=$2; shift 2
  : >"$out/$name.txt"
  i=0
  while [ "$i" -lt "$n" ]; do
    i=$((i + 1))
    echo "== $name, pass $i of $n: bench.test $*"
    (cd bench && ../bench.test "$@") 2>&1 | tee -a "$out/$name.txt"
  done
  benchstat "$out/$name.txt" | tee "$out/$name.benchstat.txt"
}

# Against the peer libraries (x/time/rate, go.uber.org/ratelimit,
# x/sync/semaphore, go-chi/httprate), from the bench module.
passes 5 peers -run '^$' -bench 'TryAcquire|AcquireAvailable|Contended64|Sharedbucket|Middleware|AcquireSeq/acquire-(1-1-1|2-1-1|16-2-8|128-64-2)/' \
  -benchtime 200ms -benchmem ./bench
# The middleware rows, in a run of their own.
go test -c -o bench.test ./bench
binpasses 6 middleware -test.run '^$' -test.bench 'Middleware/' -test.benchtime 300ms -test.benchmem
# redisstore against go-redis/redis_rate on one redis-server.
if [ "$redis" = yes ]; then
  binpasses 12 redis -test.run '^$' -test.bench Redis -test.benchtime 500ms -test.benchmem
fi
rm -f bench.test
# The library's and the service's own benchmarks, each with its baseline.
passes 5 ratelimiter -run '^$' -bench . -benchmem ./ratelimiter
passes 5 semaphore -run '^$' -bench . -benchmem ./semaphore
passes 5 sched -run '^$' -bench . -benchmem ./sched
passes 5 sharedbucket -run '^$' -bench . -benchmem ./sharedbucket
run killloop go test -run 'TestKillLoopLeavesNoLock' -count 1 -v ./sharedbucket
if [ "$redis" = yes ]; then
  passes 5 stores -run '^$' -bench 'Allow|Memory|ShouldRateLimit' -benchmem ./cmd/sluice/service/ ./store/... ./cmd/sluice/redisstore
else
  passes 5 stores -run '^$' -bench 'Allow|Memory|ShouldRateLimit' -benchmem ./cmd/sluice/service/ ./store/...
fi
run load env SLUICE_LOADTEST=1 go test -count=1 -run TestServiceLoad -v ./internal/loadgen
passes 5 loopback -run '^$' -bench Loopback -benchtime 20000x -benchmem ./cmd/sluice/internal/cli
if [ "$redis" = yes ]; then
  run grpc env SLUICE_MEASURE=1 SLUICE_MEASURE_SECS=5 SLUICE_MEASURE_STORES=memory,shm,redis \
    go test -count=1 -run MeasureGRPCvsHTTP -v -timeout 10m ./cmd/sluice
  run outage go test -count=1 -run TestRedisOutageCostsMilliseconds -v ./cmd/sluice
else
  run grpc env SLUICE_MEASURE=1 SLUICE_MEASURE_SECS=5 SLUICE_MEASURE_STORES=memory,shm \
    go test -count=1 -run MeasureGRPCvsHTTP -v -timeout 10m ./cmd/sluice
fi
# A decision under a lease against a local limiter and against /allow and
# ShouldRateLimit round trips, 5 passes of every row.
binpasses 5 lease -test.run '^$' -test.bench 'Lease/' -test.benchtime 300ms -test.benchmem
# Server CPU per million decisions of 8 replicas, leases against /allow.
run lease-cpu env SLUICE_MEASURE=1 go test -run MeasureLeaseServerCPU -v -count=1 ./cmd/sluice
# sluice serve against envoyproxy/ratelimit and gubernator (installs the
# peers on its first run).
run service-peers env SLUICE_PEERS=1 go test -run TestServiceVsPeers -v -count=1 -timeout 30m ./bench
# Run loop scaling, with the page's benchstat view.
passes 5 scale -run '^$' -bench 'RunLoopScaling/kind=(plain|sched|context|goroutines)' -benchmem ./bench
benchstat -col /kind -row /fibers -filter '.unit:ns/fiber' "$out/scale.txt" | tee "$out/scale.fibers.txt"
# Parked memory, and 100,000 sleepers against bare coroutine resumes.
passes 5 parked -run '^$' -bench ParkedMemory -benchtime 1x ./bench
passes 10 sleepers -run '^$' -bench '(VirtualTimers|CoroutineFloor)/fibers=100000$' -benchmem ./sched
date -u '+done: %Y-%m-%d %H:%M UTC' | tee -a "$out/machine.txt"
