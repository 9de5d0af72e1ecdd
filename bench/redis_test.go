package bench_test

import (
	"context"
	"regexp"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-go/sluice/cmd/sluice/redisstore"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/store"
)

// BenchmarkRedis: GCRA in one redis-server on loopback (started for the
// run), in a Lua script: Sluice's redisstore against go-redis/redis_rate
// (one script call per decision) with the client its README builds. 1000
// keys at 1000/s each, so every call is allowed. The 1g rows are one
// goroutine (per-call latency: p50-ns and p99-ns); the 16g rows are 16
// goroutines (throughput: calls/s), where redisstore sends the calls in
// flight at once as one pipelined write and one script call for all their
// keys; the 16g-hotkey rows are 16 goroutines on one key at 10^6/s, where
// redisstore decides the calls on that key in one pipeline with one script
// call. Per decision, the steadier figures on a
// loaded machine: cpu-ns/call is the benchmark process's CPU time (the
// client's side, see cpuTime), redis-cpu-ns/call redis-server's (INFO
// cpu), and redis-us/call the part of it spent running the scripts (INFO
// commandstats, EVAL and EVALSHA).
func BenchmarkRedis(b *testing.B) {
	srv := redistest.Start(b)
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer raw.Close()
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = "bench-" + strconv.Itoa(i)
	}
	impls := []struct {
		name string
		open func(b *testing.B, rate int) (allow func(ctx context.Context, key string) (bool, error), done func())
	}{
		{"sluice-redisstore", func(b *testing.B, rate int) (func(context.Context, string) (bool, error), func()) {
			s, err := redisstore.Open(srv.URL())
			if err != nil {
				b.Fatal(err)
			}
			p := store.Policy{Name: "bench", Rate: float64(rate), Burst: int64(rate)}
			return func(ctx context.Context, key string) (bool, error) {
				r, err := s.Allow(ctx, key, 1, p)
				return r.Allowed, err
			}, func() { _ = s.Close() }
		}},
		{"redis_rate", func(b *testing.B, rate int) (func(context.Context, string) (bool, error), func()) {
			c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
			l := redis_rate.NewLimiter(c)
			lim := redis_rate.Limit{Rate: rate, Burst: rate, Period: time.Second}
			return func(ctx context.Context, key string) (bool, error) {
				r, err := l.Allow(ctx, key, lim)
				if err != nil {
					return false, err
				}
				return r.Allowed > 0, nil
			}, func() { _ = c.Close() }
		}},
	}
	rows := []struct {
		name string
		g    int      // goroutines
		keys []string // called in turn
		rate int      // per key, per second, and the burst
	}{
		{"1g", 1, keys, 1000},
		{"16g", 16, keys, 1000},
		{"16g-hotkey", 16, keys[:1], 1_000_000},
	}
	for _, row := range rows {
		g, keys := row.g, row.keys
		for _, im := range impls {
			b.Run(row.name+"/"+im.name, func(b *testing.B) {
				allow, done := im.open(b, row.rate)
				defer done()
				ctx := context.Background()
				for _, k := range keys[:min(50, len(keys))] { // connect and load the script
					if _, err := allow(ctx, k); err != nil {
						b.Fatal(err)
					}
				}
				if err := raw.ConfigResetStat(ctx).Err(); err != nil { // count the timed calls only
					b.Fatal(err)
				}
				redisCPU0 := redisCPU(b, raw)
				cpu0 := cpuTime()
				var denied, failed atomic.Int64
				call := func(i int) {
					ok, err := allow(ctx, keys[(i*7919)%len(keys)])
					switch {
					case err != nil:
						failed.Add(1)
					case !ok:
						denied.Add(1)
					}
				}
				b.ReportAllocs()
				start := time.Now()
				if g == 1 {
					lat := make([]time.Duration, 0, b.N)
					for i := 0; b.Loop(); i++ {
						t := time.Now()
						call(i)
						lat = append(lat, time.Since(t))
					}
					slices.Sort(lat)
					b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
					b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
				} else {
					var next atomic.Int64
					b.SetParallelism(g / 2) // × GOMAXPROCS 2
					b.RunParallel(func(pb *testing.PB) {
						i := int(next.Add(1)) * 104729
						for pb.Next() {
							call(i)
							i++
						}
					})
				}
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "calls/s")
				b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/call")
				b.ReportMetric(float64(redisCPU(b, raw)-redisCPU0)/float64(b.N), "redis-cpu-ns/call")
				b.ReportMetric(scriptMicros(b, raw)/float64(b.N), "redis-us/call")
				if n := failed.Load() + denied.Load(); n > 0 {
					b.Fatalf("%d calls failed, %d denied, of %d: every call must be allowed", failed.Load(), denied.Load(), b.N)
				}
			})
		}
	}
}

var scriptUsec = regexp.MustCompile(`cmdstat_eval(?:sha)?:calls=\d+,usec=(\d+),`)

// scriptMicros is the time in µs redis-server has spent in EVAL and EVALSHA
// since the last CONFIG RESETSTAT.
func scriptMicros(b *testing.B, raw *redis.Client) float64 {
	info, err := raw.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var us float64
	for _, m := range scriptUsec.FindAllStringSubmatch(info, -1) {
		v, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			b.Fatal(err)
		}
		us += v
	}
	return us
}

var usedCPU = regexp.MustCompile(`used_cpu_(?:sys|user):([\d.]+)`)

// redisCPU is the CPU time redis-server has used (INFO cpu: its system and
// user time, main thread and others).
func redisCPU(b testing.TB, raw *redis.Client) time.Duration {
	info, err := raw.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var sec float64
	for _, m := range usedCPU.FindAllStringSubmatch(info, -1) {
		v, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			b.Fatal(err)
		}
		sec += v
	}
	return time.Duration(sec * 1e9)
}
