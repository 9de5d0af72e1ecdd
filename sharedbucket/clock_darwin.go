package sharedbucket

import (
	"encoding/binary"

	"golang.org/x/sys/unix"
)

// clockID names the clock a table's times are in (stored in the header).
const clockID = clockDarwin

// bootID returns this boot's identity: the kernel's boot time
// (kern.boottime, seconds and microseconds), which changes at every boot.
// Zeros if it cannot be read (then reboots cannot be detected).
func bootID() [16]byte {
	var id [16]byte
	tv, err := unix.SysctlTimeval("kern.boottime")
	if err != nil {
		return id
	}
	binary.LittleEndian.PutUint64(id[0:], uint64(tv.Sec))
	binary.LittleEndian.PutUint64(id[8:], uint64(tv.Usec))
	return id
}
