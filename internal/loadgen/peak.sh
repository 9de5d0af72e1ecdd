#!/bin/sh
# Peak throughput of `sluice serve` per store, measured with wrk on loopback.
# Usage: internal/loadgen/peak.sh [seconds]   (needs wrk and, for Redis, redis-server)
set -eu
secs=${1:-10}
dir=$(mktemp -d)
shm=$(mktemp -d /dev/shm/sluice-peak-XXXXXX)   # tmpfs, like the default shm store
trap 'kill $(cat "$dir"/pids 2>/dev/null) 2>/dev/null || true; rm -rf "$dir" "$shm"' EXIT
go build -o "$dir/sluice" ./cmd/sluice
cat > "$dir/keys.lua" <<'LUA'
counter = 0
request = function()
  counter = counter + 1
  return wrk.format("GET", "/allow?key=k" .. (counter % 1000))
end
LUA
port=18411
stores="memory shm:$shm"
if command -v redis-server >/dev/null; then
  redis-server --port 18499 --bind 127.0.0.1 --save '' --appendonly no --loglevel warning >/dev/null 2>&1 &
  echo $! >> "$dir/pids"
  stores="$stores redis://127.0.0.1:18499/0"
fi
sleep 0.3
for s in $stores; do
  port=$((port + 1))
  "$dir/sluice" serve -addr 127.0.0.1:$port -store "$s" -rate 1000 -burst 1000 2>/dev/null &
  pid=$!
  sleep 0.3
  echo "== store $s"
  wrk -t1 -c32 -d2s -s "$dir/keys.lua" "http://127.0.0.1:$port/" >/dev/null   # warm-up
  wrk -t1 -c32 -d${secs}s --latency -s "$dir/keys.lua" "http://127.0.0.1:$port/" | grep -E 'Requests/sec|50%|99%|Non-2xx|Socket'
  kill $pid; wait $pid 2>/dev/null || true
done
