#!/usr/bin/env bash
# The test command README.md gives: every package, with the race detector.
# Example functions with "// Output:" and fuzz seed corpora run as tests too.
set -euo pipefail
cd "$(dirname "$0")"
exec go test -race -count=1 -timeout 30m ./... "$@"
