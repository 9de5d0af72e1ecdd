package service

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// The store keys of the service's buckets. Each API has its own namespace,
// so that no caller of one API, domain or rule can name a bucket of another,
// on any store:
//
//	K                                 /allow, a key K no rule matches (-limits, -rate/-burst)
//	~HEX                              the same, for a K that starts with a reserved prefix
//	allow:DOMAIN|key=K|N/UNIT         /allow, a key matching a rule of Config.HTTPDomain
//	rls:DOMAIN|K=V|…|N/UNIT           ShouldRateLimit, a descriptor matching a rule
//	rls:DOMAIN|K=V|…|override:N/UNIT  ShouldRateLimit, a descriptor with a limit override
//	allow#HEX, rls#HEX                a rule's key of 256 bytes or more
//
// rules.BucketKey makes the rule forms; allowKey the first two.

// reservedPrefixes start the keys of rule buckets (rules.BucketKey); '~'
// starts an escaped /allow key.
var reservedPrefixes = [...]string{"rls:", "rls#", "allow:", "allow#", "~"}

// allowKey is the store key for an /allow key k that matches no rule: k
// itself, so the common key costs nothing, unless k starts with a reserved
// prefix; then "~" and the hex SHA-256 of k. The map is injective (up to
// SHA-256 collisions): keys kept as written start with no reserved prefix,
// escaped ones with '~', and rule buckets with "rls" or "allow".
//
// Why a digest and not "~"+k: k may be MaxKeyLen bytes, and the shm store
// holds keys of at most 256.
func allowKey(k string) string {
	if k == "" {
		return k
	}
	if c := k[0]; c != 'r' && c != 'a' && c != '~' { // the usual key: one comparison
		return k
	}
	for _, p := range reservedPrefixes {
		if strings.HasPrefix(k, p) {
			sum := sha256.Sum256([]byte(k))
			return "~" + hex.EncodeToString(sum[:])
		}
	}
	return k
}
