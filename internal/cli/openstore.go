package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/sluice-go/sluice/service/store"
	"github.com/sluice-go/sluice/service/store/redisstore"
)

// OpenStore opens the store a -store flag names: "memory", "shm" (table
// files in the user's runtime directory, sharedbucket.DefaultDir()),
// "shm:DIR" (table files in DIR), a Redis URL "redis://HOST:PORT/DB", or a
// Redis Cluster URL "rediscluster://HOST:PORT[?addr=HOST:PORT...]".
// o carries the per-store settings (zero values take defaults).
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
		return redisstore.Open(spec)
	case strings.HasPrefix(spec, "rediscluster://") || strings.HasPrefix(spec, "redisclusters://"):
		return redisstore.OpenCluster(spec)
	}
	panic("unreachable: CheckStoreSpec accepted " + spec)
}

// StoreOptions are settings for OpenStore.
type StoreOptions struct {
	Sweep    time.Duration // memory: idle sweep interval (0: none)
	ShmSlots int           // shm: slots per table (0: sharedbucket.DefaultSlots)
}

// CheckStoreSpec reports whether spec has the form of a -store value.
func CheckStoreSpec(spec string) error {
	switch {
	case spec == "memory", spec == "shm", strings.HasPrefix(spec, "shm:") && len(spec) > 4,
		strings.HasPrefix(spec, "redis://"), strings.HasPrefix(spec, "rediss://"),
		strings.HasPrefix(spec, "rediscluster://"), strings.HasPrefix(spec, "redisclusters://"):
		return nil
	}
	return fmt.Errorf("-store %q: want memory, shm, shm:DIR, redis://HOST:PORT/DB or rediscluster://HOST:PORT[?addr=HOST:PORT...]", spec)
}
