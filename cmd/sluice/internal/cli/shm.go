package cli

import (
	"context"
	"log/slog"
	"time"

	"github.com/sluice-go/sluice/sharedbucket"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/shmstore"
)

// DefaultStore is the -store default: shared memory in the user's runtime
// directory, so every `sluice serve` on the host shares limits.
const DefaultStore = "shm"

// openShm opens the shm store on dir ("" = sharedbucket.DefaultDir()).
func openShm(dir string, slots int) (store.Store, error) {
	var opts []sharedbucket.Option
	if slots > 0 {
		opts = append(opts, sharedbucket.WithSlots(slots))
	}
	return shmstore.Open(dir, opts...)
}

// evictionCheckEvery is how often serve looks at the shm tables' eviction
// counts, and evictionWarnEvery how often at most it warns per policy.
const (
	evictionCheckEvery = 10 * time.Second
	evictionWarnEvery  = 10 * time.Minute
)

// evictionWarner logs a warning when a shm table starts evicting: more keys
// are live at once than its slots hold, so new keys take over the buckets
// nearest to full and those keys start over with a full bucket (the limit
// loosens). One warning per policy per evictionWarnEvery, naming -shm-slots.
type evictionWarner struct {
	st       *shmstore.Store
	policies []store.Policy
	log      *slog.Logger
	seen     map[string]uint64    // evictions at the last check, by policy name
	warned   map[string]time.Time // last warning, by policy name
}

func newEvictionWarner(st *shmstore.Store, policies []store.Policy, log *slog.Logger) *evictionWarner {
	return &evictionWarner{st: st, policies: policies, log: log,
		seen: make(map[string]uint64), warned: make(map[string]time.Time)}
}

// check compares each policy's eviction count with the last check's and
// warns (rate-limited) for those that grew.
func (w *evictionWarner) check(now time.Time) {
	for _, p := range w.policies {
		ev, _ := w.st.Evictions(p)
		grew := ev - w.seen[p.Name]
		w.seen[p.Name] = ev
		if grew == 0 {
			continue
		}
		if last, ok := w.warned[p.Name]; ok && now.Sub(last) < evictionWarnEvery {
			continue
		}
		w.warned[p.Name] = now
		w.log.Warn("shm table is full: live buckets are being evicted, so evicted keys start over and the limit loosens; raise -shm-slots",
			"policy", p.Name, "evicted", grew, "evicted_total", ev, "shm_slots", w.st.Slots(), "dir", w.st.Dir())
	}
}

// startEvictionWarner checks every evictionCheckEvery until ctx ends or the
// returned stop is called (stop waits for the goroutine).
func startEvictionWarner(ctx context.Context, st *shmstore.Store, policies []store.Policy, log *slog.Logger) (stop func()) {
	w := newEvictionWarner(st, policies, log)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tk := time.NewTicker(evictionCheckEvery)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-tk.C:
				w.check(now)
			}
		}
	}()
	return func() { cancel(); <-done }
}
