package cli

import (
	"github.com/sluice-go/sluice/service/store"
	"github.com/sluice-go/sluice/service/store/shmstore"
	"github.com/sluice-go/sluice/sharedbucket"
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
