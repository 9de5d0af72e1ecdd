package cli

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/sluice-go/sluice/cmd/sluice/redisstore"
	"github.com/sluice-go/sluice/store"
)

// OpenStore opens the store a -store flag names: "memory", "shm" (table
// files in the user's runtime directory, sharedbucket.DefaultDir()),
// "shm:DIR" (table files in DIR), a Redis URL "redis://HOST:PORT/DB", a
// Redis Cluster URL "rediscluster://HOST:PORT[?addr=HOST:PORT...]", or a
// Sentinel URL "redis-sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB]".
// o carries the per-store settings (zero values take defaults). A Redis
// store comes wrapped in a store.Breaker, so that while Redis is down
// decisions follow -fail at once and a background probe notices its return.
func OpenStore(spec string, o StoreOptions) (store.Store, error) {
	if err := CheckStoreSpec(spec); err != nil {
		return nil, err
	}
	switch {
	case spec == "memory":
		return store.NewMemory(store.WithSweep(o.Sweep)), nil
	case spec == "shm" || strings.HasPrefix(spec, "shm:"):
		return openShm(strings.TrimPrefix(strings.TrimPrefix(spec, "shm"), ":"), o.ShmSlots)
	case strings.HasPrefix(spec, "redis://") || strings.HasPrefix(spec, "rediss://"):
		return o.breaker(redisstore.Open(spec, redisstore.WithTimeout(o.Timeout)))
	case strings.HasPrefix(spec, "rediscluster://") || strings.HasPrefix(spec, "redisclusters://"):
		return o.breaker(redisstore.OpenCluster(spec, redisstore.WithTimeout(o.Timeout)))
	case strings.HasPrefix(spec, "redis-sentinel://") || strings.HasPrefix(spec, "redis-sentinels://"):
		return o.breaker(redisstore.OpenSentinel(spec, redisstore.WithTimeout(o.Timeout)))
	}
	panic("unreachable: CheckStoreSpec accepted " + spec)
}

// StoreOptions are settings for OpenStore.
type StoreOptions struct {
	Sweep    time.Duration // memory: idle sweep interval (0: none)
	ShmSlots int           // shm: slots per table (0: sharedbucket.DefaultSlots)
	// Timeout bounds Redis dials, reads and writes and the breaker's probes
	// (0: redisstore.DefaultTimeout).
	Timeout time.Duration
	Logger  *slog.Logger // the breaker's open/close lines (nil: none)
}

func (o StoreOptions) breaker(s *redisstore.Store, err error) (store.Store, error) {
	if err != nil {
		return nil, err
	}
	return store.NewBreaker(s, store.BreakerOptions{ProbeTimeout: o.Timeout, Logger: o.Logger}), nil
}

// CheckStoreSpec reports whether spec has the form of a -store value.
func CheckStoreSpec(spec string) error {
	switch {
	case spec == "memory", spec == "shm", strings.HasPrefix(spec, "shm:") && len(spec) > 4,
		strings.HasPrefix(spec, "redis://"), strings.HasPrefix(spec, "rediss://"),
		strings.HasPrefix(spec, "rediscluster://"), strings.HasPrefix(spec, "redisclusters://"):
		return nil
	case strings.HasPrefix(spec, "redis-sentinel://"), strings.HasPrefix(spec, "redis-sentinels://"):
		_, err := redisstore.ParseSentinelURL(spec)
		return err
	}
	return fmt.Errorf("-store %q: want memory, shm, shm:DIR, redis://HOST:PORT/DB, rediscluster://HOST:PORT[?addr=HOST:PORT...] or redis-sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB]", spec)
}
