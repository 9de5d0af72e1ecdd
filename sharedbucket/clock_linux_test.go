package sharedbucket

import "golang.org/x/sys/unix"

// nowClockID is the clock_gettime clock Now reads.
const nowClockID = unix.CLOCK_MONOTONIC
