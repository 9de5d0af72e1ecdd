// Package tools holds no code: its module pins the tools the repository runs,
// apart from the other modules, whose versions they would otherwise raise:
// benchstat for docs/bench.sh (`go tool -modfile=bench/tools/go.mod
// benchstat`) and staticcheck for .ci/run, which builds it from this pin.
package tools
