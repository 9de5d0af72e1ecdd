package sharedbucket

import "golang.org/x/sys/unix"

// nowClockID is the clock_gettime clock Now reads (mach_absolute_time).
const nowClockID = unix.CLOCK_UPTIME_RAW
