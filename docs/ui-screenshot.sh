#!/usr/bin/env bash
# Makes docs/ui.png: the /ui page of `sluice demo`'s server under the demo's
# load (three replicas sharing tenant-a's 10/s, each wanting 20/s), plus four
# clients of the default policy (10/s, burst 10) at 40, 25, 15 and 5 requests
# a second, so that three of them are denied. Needs Go, chromium.
#
#   docs/ui-screenshot.sh            # about 65 s
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
go build -o "$tmp/sluice" ./cmd/sluice
"$tmp/sluice" demo -duration 120s >"$tmp/demo.out" &
until url=$(grep -o 'http://[0-9.:]*' "$tmp/demo.out" | head -1) && [ -n "$url" ]; do sleep 0.2; done
for kr in 198.51.100.7:40 203.0.113.9:25 192.0.2.33:15 198.51.100.20:5; do
	"$tmp/sluice" client -limiter "$url" -key "${kr%:*}" -rps "${kr#*:}" -duration 110s -no-cache >/dev/null &
done
sleep 60
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
	--disable-background-networking --disable-component-update --disable-sync \
	--user-data-dir="$tmp/profile" --hide-scrollbars --window-size=1400,760 \
	--virtual-time-budget=3000 --screenshot=docs/ui.png "$url/ui" 2>/dev/null
echo "wrote docs/ui.png"
