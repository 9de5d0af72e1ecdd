// Package tools holds no code: its module pins the tools docs/bench.sh runs
// (`go tool -modfile=bench/tools/go.mod benchstat`), apart from the bench
// module, whose versions they would otherwise raise.
package tools
