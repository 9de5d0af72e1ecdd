package cli

import (
	"github.com/sluice-go/sluice/service/store"
	"github.com/sluice-go/sluice/service/store/shmstore"
)

// DefaultStore is the -store default: shared memory in the user's runtime
// directory, so every `sluice serve` on the host shares limits.
const DefaultStore = "shm"

// openShm opens the shm store on dir ("" = sharedbucket.DefaultDir()).
func openShm(dir string) (store.Store, error) { return shmstore.Open(dir) }
