package limitresponse

import "fmt"

// CheckName reports why name cannot be a policy name, or nil when it can.
// A policy name is any string of printable ASCII bytes (0x20 to 0x7e),
// the empty string included.
//
// Why this rule: the name is written into RateLimit-Policy and RateLimit as
// an RFC 9651 structured-field string, whose alphabet is exactly printable
// ASCII ('"' and '\' are escaped on the way out, see sfString); a Prometheus
// label takes any UTF-8, so the header is the narrower of the two places a
// name goes. The service and httplimit both call this, so a name one of
// them accepts the other accepts too; each adds its own error prefix, or,
// like the service for a key that is not a valid name, picks another name.
func CheckName(name string) error {
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("policy name %q: must be printable ASCII", name)
		}
	}
	return nil
}
