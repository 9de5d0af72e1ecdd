package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/textproto"
	"strings"
)

// ErrNoClientIP is wrapped by the key error of a request whose peer address
// (Request.RemoteAddr) is not an IP, as on a server listening on a Unix
// socket. Such a request gets a 400. Forwarding headers never cause it: a
// hop they do not name ends the walk at the last address known.
var ErrNoClientIP = errors.New("httplimit: no client IP")

// DefaultIPv6Prefix is how many leading bits of an IPv6 client address
// KeyByIP keys on, unless IPv6Prefix says otherwise: a /64, one network.
//
// Why not the whole address: a /64 is the smallest network an ISP hands a
// subscriber, and a host on it picks its own 64 low bits (privacy addresses
// change them daily; a hostile client can change them per request), so a
// per-address key gives one client 2^64 buckets. A /64 is the IPv6 match of
// one IPv4 address behind a home router: the unit a client cannot multiply.
const DefaultIPv6Prefix = 64

// The headers a trusted proxy may write the client's address into.
const (
	headerXFF       = "X-Forwarded-For"
	headerForwarded = "Forwarded"
)

// ProxyHeader names the one header KeyByIP reads the hops from: the header
// the trusted proxies append the address they saw to. "X-Forwarded-For" is
// the default: nginx ($proxy_add_x_forwarded_for), HAProxy (option
// forwardfor), Envoy, Go's httputil.ReverseProxy and the cloud load
// balancers write it. "Forwarded" (RFC 7239) is for proxies configured to
// write that instead. The other header is never read.
//
// Why one header and not both: nothing in a request tells which of the two
// a trusted proxy wrote, so a rule that reads both, whether it prefers one
// or merges them, lets the client choose the address through the header
// the proxies leave alone. Proxies that write both write the same hops
// into each; either name works for them.
func ProxyHeader(name string) MiddlewareOption {
	canon := http.CanonicalHeaderKey(name)
	return func(c *mwConfig) {
		if canon != headerXFF && canon != headerForwarded {
			c.err = fmt.Errorf("httplimit: proxy header %q: want X-Forwarded-For or Forwarded", name)
		}
		c.proxyHeader = canon
	}
}

// IPv6Prefix sets how many leading bits of an IPv6 client address KeyByIP
// keys on, from 1 to 128 (default DefaultIPv6Prefix). The key of an IPv6
// client is its network in CIDR form, "2001:db8:1:2::/64"; with 128 it is
// the address itself, "2001:db8:1:2::7". IPv4 clients are keyed by address.
func IPv6Prefix(bits int) MiddlewareOption {
	return func(c *mwConfig) {
		if bits < 1 || bits > 128 {
			c.err = fmt.Errorf("httplimit: IPv6 prefix /%d: want 1 to 128 bits", bits)
		}
		c.v6bits = bits
	}
}

// ipKeyer finds the client IP of a request (see KeyByIP). It is read-only
// after newIPKeyer and safe for concurrent use.
type ipKeyer struct {
	trusted   []netip.Prefix // normalized: IPv4 as IPv4, masked
	header    string         // canonical name of the header the trusted proxies write
	forwarded bool           // header is RFC 7239 Forwarded, else X-Forwarded-For
	v6bits    int
}

func newIPKeyer(proxies []string, header string, v6bits int) (*ipKeyer, error) {
	k := &ipKeyer{header: header, forwarded: header == headerForwarded, v6bits: v6bits}
	for _, s := range proxies {
		if p, err := netip.ParsePrefix(s); err == nil {
			// An IPv4-mapped prefix ("::ffff:10.0.0.0/104") names IPv4
			// addresses, and every address is compared unmapped.
			if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
				p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
			}
			k.trusted = append(k.trusted, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("httplimit: trusted proxy %q: want an IP or a CIDR prefix such as 10.0.0.0/8", s)
		}
		a = a.WithZone("").Unmap()
		k.trusted = append(k.trusted, netip.PrefixFrom(a, a.BitLen()))
	}
	return k, nil
}

// trusts reports whether a, normalized, is one of the trusted proxies.
func (k *ipKeyer) trusts(a netip.Addr) bool {
	for _, p := range k.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// key returns the client's key: the first untrusted hop walking back from
// the peer, normalized. It allocates nothing for an IPv4 client written in
// canonical form.
func (k *ipKeyer) key(r *http.Request) (string, error) {
	peer, text, ok := parseNode(r.RemoteAddr)
	if !ok {
		return "", fmt.Errorf("%w: RemoteAddr %q", ErrNoClientIP, r.RemoteAddr)
	}
	if len(k.trusted) > 0 && k.trusts(peer) {
		peer, text = k.walk(r.Header[k.header], peer, text)
	}
	return k.keyOf(peer, text), nil
}

// walk goes back through the hops the header lines list, from the last
// entry of the last line (the one the peer wrote), starting from the
// trusted peer last. It returns the first address that is not a trusted
// proxy; the last address known when an entry names none ("unknown", an
// obfuscated identifier, anything unreadable): the trusted hop that wrote
// it; or, when every hop is trusted, the farthest.
//
// Every entry walk reads was written by a hop it trusts: the walk stops at
// the first untrusted address, which a trusted proxy wrote, and never
// reads what the client itself sent, to the left of it.
func (k *ipKeyer) walk(lines []string, last netip.Addr, lastText string) (netip.Addr, string) {
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i]
		for line != "" {
			var elem string
			if k.forwarded {
				elem, line = lastForwardedElem(line)
			} else {
				elem, line = lastListElem(line)
			}
			elem = textproto.TrimString(elem)
			if elem == "" {
				continue // the list syntax allows empty entries; they name no hop
			}
			node, ok := elem, true
			if k.forwarded {
				node, ok = forwardedFor(elem)
			}
			var a netip.Addr
			var text string
			if ok {
				a, text, ok = parseNode(node)
			}
			switch {
			case !ok:
				return last, lastText
			case !k.trusts(a):
				return a, text
			}
			last, lastText = a, text
		}
	}
	return last, lastText
}

// keyOf returns the key of a normalized address: IPv6 as its network of
// v6bits, IPv4 (and IPv6 with v6bits 128) as the canonical text, which is
// text itself, not a copy, when text was written canonically.
func (k *ipKeyer) keyOf(a netip.Addr, text string) string {
	if a.Is4() && strings.IndexByte(text, ':') < 0 {
		// netip.ParseAddr reads IPv4 strictly (four decimal octets, no
		// leading zeros): what it accepts is canonical already.
		return text
	}
	var buf [len("ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255/128")]byte
	var b []byte
	if a.Is6() && k.v6bits < 128 {
		b = netip.PrefixFrom(a, k.v6bits).Masked().AppendTo(buf[:0])
	} else {
		b = a.AppendTo(buf[:0])
	}
	if string(b) == text {
		return text
	}
	return string(b)
}

// lastListElem splits off the last comma-separated entry of an
// X-Forwarded-For line. Its entries are bare addresses, never quoted.
func lastListElem(s string) (elem, rest string) {
	c := strings.LastIndexByte(s, ',')
	if c < 0 {
		return s, ""
	}
	return s[c+1:], s[:c]
}

// lastForwardedElem splits off the last comma-separated element of a
// Forwarded line, reading from the right so that the element a trusted
// proxy appended is delimited by its own quotes whatever the client wrote
// before it (an unterminated quote there cannot swallow it). Read from the
// right, a quote ends a quoted string unless an odd run of backslashes
// escapes it. An element whose quotes do not pair up comes back whole, and
// forwardedFor refuses it.
func lastForwardedElem(s string) (elem, rest string) {
	quoted := false
	for i := len(s) - 1; i >= 0; i-- {
		switch s[i] {
		case '"':
			if !quoted {
				quoted = true
				continue
			}
			n := 0
			for j := i - 1; j >= 0 && s[j] == '\\'; j-- {
				n++
			}
			if n%2 == 0 {
				quoted = false
			} else {
				i -= n // an escaped quote: skip it and its backslashes
			}
		case ',':
			if !quoted {
				return s[i+1:], s[:i]
			}
		}
	}
	return s, ""
}

// forwardedFor returns the for= value of one Forwarded element
// (for=192.0.2.60;proto=http;by=203.0.113.43, for="[2001:db8::1]:4711"),
// unquoted; false for an element that is malformed, has no for=, or has two.
func forwardedFor(elem string) (string, bool) {
	node, found := "", false
	for elem != "" {
		var pair string
		pair, elem = cutOutsideQuotes(elem, ';')
		pair = textproto.TrimString(pair)
		if pair == "" {
			continue
		}
		name, val, ok := strings.Cut(pair, "=")
		if !ok {
			return "", false
		}
		v, ok := unquote(val)
		if !ok {
			return "", false
		}
		if !strings.EqualFold(name, "for") {
			continue
		}
		if found {
			return "", false // RFC 7239 §4: a parameter occurs once per element
		}
		node, found = v, true
	}
	return node, found
}

// unquote returns a token as it is and a quoted string's content, its
// escapes undone; false if a quote is out of place.
func unquote(v string) (string, bool) {
	if !strings.HasPrefix(v, `"`) {
		return v, !strings.Contains(v, `"`)
	}
	if len(v) < 2 || v[len(v)-1] != '"' {
		return "", false
	}
	in := v[1 : len(v)-1]
	if !strings.ContainsAny(in, `"\`) {
		return in, true
	}
	var b strings.Builder
	for i := 0; i < len(in); i++ {
		switch c := in[i]; c {
		case '"':
			return "", false
		case '\\':
			if i++; i == len(in) {
				return "", false
			}
			b.WriteByte(in[i])
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), true
}

// parseNode reads one hop's address, as RemoteAddr, an X-Forwarded-For
// entry or a Forwarded for= value writes it: "192.0.2.1", "192.0.2.1:80",
// "[2001:db8::1]:4711", a bare "2001:db8::1", "fe80::1%eth0". It returns
// the address normalized (IPv4-mapped IPv6 as IPv4, the zone dropped) and
// the address's text as written. "unknown", an obfuscated "_id", a bad port
// and the unspecified address are not addresses.
func parseNode(s string) (netip.Addr, string, bool) {
	host := s
	switch {
	case strings.HasPrefix(s, "["):
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return netip.Addr{}, "", false
		}
		host = s[1:end]
		if rest := s[end+1:]; rest != "" && (rest[0] != ':' || !validPort(rest[1:])) {
			return netip.Addr{}, "", false
		}
	default:
		// One colon is IPv4 with a port; more, a bare IPv6 address.
		if c := strings.IndexByte(s, ':'); c >= 0 && strings.LastIndexByte(s, ':') == c {
			if !validPort(s[c+1:]) {
				return netip.Addr{}, "", false
			}
			host = s[:c]
		}
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, "", false
	}
	// Normalized before the check: "::%0" and "::ffff:0.0.0.0" are
	// unspecified too.
	if a = a.WithZone("").Unmap(); a.IsUnspecified() {
		return netip.Addr{}, "", false
	}
	return a, host, true
}

// validPort reports whether p is a port as RFC 7239 §6 writes one: up to
// five digits, or an obfuscated "_" identifier.
func validPort(p string) bool {
	if p == "" {
		return false
	}
	if p[0] == '_' {
		if len(p) == 1 {
			return false
		}
		for i := 1; i < len(p); i++ {
			if c := p[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '.' || c == '_' || c == '-') {
				return false
			}
		}
		return true
	}
	if len(p) > 5 {
		return false
	}
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return false
		}
	}
	return true
}
