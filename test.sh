#!/usr/bin/env bash
# The test command README.md gives: every package of every module (the
# library at the root, cmd/sluice, examples, bench; go.work names them),
# with the race detector. Example functions with "// Output:" and fuzz seed
# corpora run as tests too.
set -euo pipefail
cd "$(dirname "$0")"
status=0
go test -race -count=1 -timeout 30m github.com/sluice-go/sluice/... "$@" || status=$?
# The Redis store's tests start a real redis-server and skip without one.
if ! command -v redis-server >/dev/null 2>&1 && [ ! -x /usr/bin/redis-server ]; then
	echo "test.sh: redis-server not found: the Redis tests were skipped"
fi
exit "$status"
