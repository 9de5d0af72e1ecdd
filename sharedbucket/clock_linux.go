package sharedbucket

import (
	"encoding/hex"
	"os"
	"strings"
)

// clockID names the clock a table's times are in (stored in the header).
const clockID = clockLinux

// bootIDPath names the kernel's per-boot random UUID.
const bootIDPath = "/proc/sys/kernel/random/boot_id"

// bootID returns the 16 bytes of this boot's identity, or zeros if the kernel
// does not expose it (then reboots cannot be detected; files on tmpfs vanish
// at reboot anyway).
func bootID() [16]byte {
	var id [16]byte
	raw, err := os.ReadFile(bootIDPath)
	if err != nil {
		return id
	}
	s := strings.ReplaceAll(strings.TrimSpace(string(raw)), "-", "")
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != 16 {
		return id
	}
	copy(id[:], b)
	return id
}
