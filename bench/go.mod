module github.com/sluice-go/sluice/bench

go 1.26.0

require (
	github.com/go-chi/httprate v0.16.1
	github.com/go-redis/redis_rate/v10 v10.0.1
	github.com/redis/go-redis/v9 v9.23.0
	github.com/sluice-go/sluice v0.0.0-00010101000000-000000000000
	go.uber.org/goleak v1.3.0
	go.uber.org/ratelimit v0.3.1
	golang.org/x/sync v0.25.0
	golang.org/x/sys v0.50.0
	golang.org/x/time v0.16.0
)

require github.com/cespare/xxhash/v2 v2.3.0 // indirect

require (
	github.com/benbjohnson/clock v1.3.5 // indirect
	github.com/klauspost/cpuid/v2 v2.4.0 // indirect
	github.com/sluice-go/sluice/cmd/sluice v0.0.0-00010101000000-000000000000
	github.com/zeebo/xxh3 v1.1.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
)

replace github.com/sluice-go/sluice => ../

replace github.com/sluice-go/sluice/cmd/sluice => ../cmd/sluice
