package httplimit

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// ErrNoClientIP is wrapped by the key error of a request whose client
// address cannot be read (a RemoteAddr that is not an IP, or a forwarding
// header from a trusted proxy that names no IP). Such a request gets a 400.
var ErrNoClientIP = errors.New("httplimit: no client IP")

// ipKeyer finds the client IP of a request. Forwarding headers are believed
// only from a trusted proxy, and only as far back as the chain of trusted
// proxies goes: the client is the nearest address, walking from the peer
// back through Forwarded (RFC 7239) or else X-Forwarded-For, that is not a
// trusted proxy. Anyone can write those headers; only the hops we trust
// append to them honestly.
type ipKeyer struct {
	trusted []netip.Prefix
}

func parseTrusted(proxies []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range proxies {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("httplimit: trusted proxy %q: want an IP or a CIDR prefix such as 10.0.0.0/8", s)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

func (k *ipKeyer) trusts(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range k.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// key returns the client IP as written in the request (no allocation).
func (k *ipKeyer) key(r *http.Request) (string, error) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr // a RemoteAddr without a port (some test servers)
	}
	peer, err := netip.ParseAddr(host)
	if err != nil {
		return "", fmt.Errorf("%w: RemoteAddr %q", ErrNoClientIP, r.RemoteAddr)
	}
	if len(k.trusted) == 0 || !k.trusts(peer) {
		return host, nil
	}
	if fwd := r.Header.Values("Forwarded"); len(fwd) > 0 {
		return k.walk(fwd, forwardedFor)
	}
	if xff := r.Header.Values("X-Forwarded-For"); len(xff) > 0 {
		return k.walk(xff, plainAddr)
	}
	return host, nil
}

// walk goes through the comma-separated elements of the header lines from
// the last (the hop nearest us) back, and returns the first address that is
// not a trusted proxy, or the first element if all are.
func (k *ipKeyer) walk(lines []string, parse func(elem string) (string, bool)) (string, error) {
	first := ""
	for i := len(lines) - 1; i >= 0; i-- {
		rest := lines[i]
		for rest != "" {
			elem := rest
			if c := strings.LastIndexByte(rest, ','); c >= 0 {
				elem, rest = rest[c+1:], rest[:c]
			} else {
				rest = ""
			}
			elem = strings.TrimSpace(elem)
			if elem == "" {
				continue
			}
			s, ok := parse(elem)
			if !ok {
				// A hop we trust wrote an element we cannot read (an
				// obfuscated identifier, "unknown"): the chain stops here.
				return "", fmt.Errorf("%w: forwarded element %q", ErrNoClientIP, elem)
			}
			a, err := netip.ParseAddr(s)
			if err != nil {
				return "", fmt.Errorf("%w: forwarded element %q", ErrNoClientIP, elem)
			}
			if !k.trusts(a) {
				return s, nil
			}
			first = s
		}
	}
	if first == "" {
		return "", fmt.Errorf("%w: empty forwarding header", ErrNoClientIP)
	}
	return first, nil
}

// plainAddr reads an X-Forwarded-For element: an IP, possibly with a port
// or in brackets.
func plainAddr(elem string) (string, bool) {
	return stripPort(elem), true
}

// forwardedFor reads the for= parameter of one Forwarded element
// (for=192.0.2.60;proto=http;by=203.0.113.43, for="[2001:db8::1]:4711").
func forwardedFor(elem string) (string, bool) {
	for elem != "" {
		pair := elem
		if sc := strings.IndexByte(elem, ';'); sc >= 0 {
			pair, elem = elem[:sc], elem[sc+1:]
		} else {
			elem = ""
		}
		name, val, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || !strings.EqualFold(name, "for") {
			continue
		}
		val = strings.Trim(val, `"`)
		return stripPort(val), true
	}
	return "", false
}

// stripPort removes brackets and a port: "[2001:db8::1]:4711" → "2001:db8::1",
// "192.0.2.1:80" → "192.0.2.1"; a bare IPv6 address is left whole.
func stripPort(s string) string {
	if strings.HasPrefix(s, "[") {
		if end := strings.IndexByte(s, ']'); end > 0 {
			return s[1:end]
		}
		return s
	}
	if strings.Count(s, ":") == 1 {
		return s[:strings.IndexByte(s, ':')]
	}
	return s
}
