package service

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// allowArgs are the parameters of one /allow request.
type allowArgs struct {
	key    string
	n      int64
	hasKey bool
	nRaw   string
	hasN   bool
}

// parseAllowQuery reads key and n from a URL query or form body into a,
// ignoring other parameters. It refuses a repeated key or n, since which one
// a proxy or client library meant is a guess. It does not validate values.
//
// Why not url.ParseQuery: the hot path would allocate a map per request; this
// allocates only when a value is escaped.
func parseAllowQuery(raw string, a *allowArgs) error {
	for raw != "" {
		var pair string
		pair, raw, _ = strings.Cut(raw, "&")
		if pair == "" {
			continue
		}
		name, value, _ := strings.Cut(pair, "=")
		if strings.ContainsAny(name, "%+") {
			n, err := url.QueryUnescape(name)
			if err != nil {
				return fmt.Errorf("bad query parameter name %q", name)
			}
			name = n
		}
		if name != "key" && name != "n" {
			continue
		}
		if strings.ContainsAny(value, "%+") {
			v, err := url.QueryUnescape(value)
			if err != nil {
				return fmt.Errorf("bad %s value %q: %v", name, value, err)
			}
			value = v
		}
		if name == "key" {
			if a.hasKey {
				return errors.New("key given more than once")
			}
			a.key, a.hasKey = value, true
		} else {
			if a.hasN {
				return errors.New("n given more than once")
			}
			a.nRaw, a.hasN = value, true
		}
	}
	return nil
}

// validate checks key and n (not against the burst, which depends on the
// key's policy) and sets a.n.
func (a *allowArgs) validate() error {
	switch {
	case !a.hasKey || a.key == "":
		return errors.New("missing key: use /allow?key=K[&n=1]")
	case len(a.key) > MaxKeyLen:
		return fmt.Errorf("key is %d bytes, over the %d-byte maximum", len(a.key), MaxKeyLen)
	}
	a.n = 1
	if a.hasN {
		n, err := strconv.ParseInt(a.nRaw, 10, 64)
		if err != nil {
			return fmt.Errorf("n=%q is not an integer", a.nRaw)
		}
		if n < 1 {
			return fmt.Errorf("n=%d: must be at least 1", n)
		}
		a.n = n
	}
	return nil
}
