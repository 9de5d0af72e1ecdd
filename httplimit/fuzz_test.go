package httplimit

import (
	"context"
	"math"
	"math/big"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/limitresponse"
	"github.com/sluice-go/sluice/store"
)

// The fuzz targets of the parsers fed from the network. Each asserts what
// the parse must mean, not only that it returns. Run one for a million
// executions with, for example,
//
//	go test -run '^$' -fuzz '^FuzzClientIPXFF$' -fuzztime 1000000x -parallel 1 ./httplimit/

// fuzzTrusted are the trusted proxies of the client IP targets; the peer
// is 10.0.0.2.
var fuzzTrusted = []string{"10.0.0.0/8", "2001:db8:ffff::/48"}

func FuzzClientIPXFF(f *testing.F) {
	for _, s := range []string{
		"", "203.0.113.9", "1.1.1.1, 203.0.113.9", "1.1.1.1\n203.0.113.9", "10.1.1.1, 10.2.2.2",
		"2001:db8:cafe::17", "[2001:db8:cafe::17]:4711", "203.0.113.9:80", "::ffff:203.0.113.9",
		"fe80::1%eth0", "unknown, 10.0.0.9", ",,, ,", "1.1.1.1:99999", "[::1", "0.0.0.0",
	} {
		f.Add(s, []byte{198, 51, 100, 7}, uint16(0))
	}
	f.Add("x", []byte{0x20, 0x01, 0x0d, 0xb8, 0xca, 0xfe, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x17}, uint16(4711))
	f.Add("x", []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 203, 0, 113, 9}, uint16(1))
	fuzzClientIP(f, headerXFF)
}

func FuzzClientIPForwarded(f *testing.F) {
	for _, s := range []string{
		"", "for=203.0.113.9", `for="[2001:db8:cafe::17]:4711";proto=https;by=10.0.0.2`,
		"for=1.1.1.1, for=203.0.113.9", "for=1.1.1.1\nfor=203.0.113.9", "for=unknown", `for="_hidden"`,
		`for="`, `for="a\"`, `for="\\"`, `host="a, for=1.1.1.1";for=203.0.113.9`, "For=10.1.1.1, for=10.2.2.2",
		"for=203.0.113.9;for=1.1.1.1", "proto=https", `for="203.0.113.9:_p"`, `;;, ,for=`, `for=\`,
	} {
		f.Add(s, []byte{198, 51, 100, 7}, uint16(0))
	}
	f.Add(`for="`, []byte{0x20, 0x01, 0x0d, 0xb8, 0xca, 0xfe, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x17}, uint16(4711))
	fuzzClientIP(f, headerForwarded)
}

// fuzzClientIP checks, for header lines the fuzzer writes (one a line of
// text):
//
//   - whatever the lines say, the key is the canonical key of an address:
//     the peer's or one the lines name, never an error;
//   - from an untrusted peer, the lines are never read;
//   - a header no trusted proxy wrote never decides: with the lines as what
//     the client sent and the trusted proxy's entry for an untrusted client
//     appended (joined to the last line, as nginx does, or on a line of its
//     own, as HAProxy does), the key is that client's, whatever the
//     client's lines were.
func fuzzClientIP(f *testing.F, header string) {
	keyers := map[int]*ipKeyer{}
	for _, bits := range []int{DefaultIPv6Prefix, 128} {
		k, err := newIPKeyer(fuzzTrusted, header, bits)
		require.NoError(f, err)
		keyers[bits] = k
	}
	peer := netip.MustParseAddr("10.0.0.2")
	f.Fuzz(func(t *testing.T, sent string, client []byte, port uint16) {
		lines := strings.Split(sent, "\n")
		for bits, k := range keyers {
			r := &http.Request{RemoteAddr: "10.0.0.2:41000", Header: http.Header{header: lines}}
			key, err := k.key(r)
			require.NoError(t, err)
			requireCanonicalKey(t, key, bits)
			a, text := k.walk(lines, peer, "10.0.0.2")
			require.Equal(t, key, k.keyOf(a, text))
			// A quoted for= value comes unescaped ("::1\0" is ::10).
			require.True(t, text == "10.0.0.2" || strings.Contains(sent, text) || strings.Contains(strings.ReplaceAll(sent, `\`, ""), text),
				"key %q from text %q", key, text)

			r.RemoteAddr = "198.51.100.7:41000"
			key, err = k.key(r)
			require.NoError(t, err)
			require.Equal(t, "198.51.100.7", key)

			c := fuzzClient(client)
			entry := proxyEntry(header, c, port)
			appended := append(lines[:len(lines):len(lines)], entry)
			if port%2 == 0 {
				appended = append(lines[:len(lines)-1:len(lines)-1], lines[len(lines)-1]+", "+entry)
			}
			r.RemoteAddr = "10.0.0.2:41000"
			r.Header = http.Header{header: appended}
			key, err = k.key(r)
			require.NoError(t, err)
			require.Equal(t, oracleKey(c, bits), key, "the proxy wrote %q after %q", entry, sent)
		}
	})
}

// fuzzClient makes an untrusted client address of the fuzzer's bytes:
// IPv6 from 16 or more (IPv4-mapped ones included), else IPv4.
func fuzzClient(b []byte) netip.Addr {
	var a netip.Addr
	if len(b) >= 16 {
		a = netip.AddrFrom16([16]byte(b[:16]))
	} else {
		var v4 [4]byte
		copy(v4[:], b)
		a = netip.AddrFrom4(v4)
	}
	u := a.Unmap()
	if u.IsUnspecified() || u.Is4() && u.As4()[0] == 10 || u.Is6() && netip.MustParsePrefix("2001:db8:ffff::/48").Contains(u) {
		return netip.MustParseAddr("203.0.113.9")
	}
	return a
}

// proxyEntry is the entry a trusted proxy writes for a client a, with a
// port when port is odd.
func proxyEntry(header string, a netip.Addr, port uint16) string {
	node := a.String()
	if port%2 == 1 {
		node = netip.AddrPortFrom(a, port).String()
	} else if a.Is6() && header == headerForwarded {
		node = "[" + node + "]"
	}
	if header == headerXFF {
		return node
	}
	return `for="` + node + `";proto=https`
}

// oracleKey is the key of client a, computed apart from keyOf.
func oracleKey(a netip.Addr, bits int) string {
	u := a.Unmap()
	if u.Is4() || bits == 128 {
		return u.String()
	}
	p, err := u.Prefix(bits)
	if err != nil {
		panic(err)
	}
	return p.String()
}

// requireCanonicalKey checks that key is an IPv4 address or, for IPv6, a
// network of bits (an address when bits is 128), each written canonically.
func requireCanonicalKey(t *testing.T, key string, bits int) {
	if p, err := netip.ParsePrefix(key); err == nil {
		require.Less(t, bits, 128, key)
		require.True(t, p.Addr().Is6() && !p.Addr().Is4In6(), key)
		require.Equal(t, bits, p.Bits(), key)
		require.Equal(t, p.Masked().String(), key)
		return
	}
	a, err := netip.ParseAddr(key)
	require.NoError(t, err, key)
	require.Empty(t, a.Zone(), key)
	require.False(t, a.Is4In6() || a.IsUnspecified(), key)
	require.True(t, a.Is4() || bits == 128, key)
	require.Equal(t, a.String(), key)
}

// FuzzRetryAfter: any Retry-After (and Date) gives either no hold or one in
// [0, MaxHold]; every run of digits, however long, is a hold of that many
// seconds capped at MaxHold, and so is every HTTP-date.
func FuzzRetryAfter(f *testing.F) {
	for _, s := range []string{
		"0", "2", "3600", "3601", "9223372036854775807", "9223372036854775808", "100000000000000000000",
		"-1", "+1", "1.5", " 7 ", "soon", "Sat, 01 Jan 2000 00:00:02 GMT", "Saturday, 01-Jan-00 00:00:02 GMT",
		"Sat Jan  1 00:00:02 2000", "Fri, 31 Dec 9999 23:59:59 GMT", "Mon, 01 Jan 0001 00:00:00 GMT",
	} {
		f.Add(s, "Sat, 01 Jan 2000 00:00:00 GMT")
		f.Add(s, "")
	}
	now := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	maxSeconds := big.NewInt(int64(MaxHold / time.Second))
	f.Fuzz(func(t *testing.T, v, date string) {
		h := http.Header{"Retry-After": {v}}
		if date != "" {
			h["Date"] = []string{date}
		}
		d, ok := retryAfter(h, now)
		require.True(t, d >= 0 && d <= MaxHold, "%v", d)
		s := strings.TrimSpace(v)
		if n, isNum := new(big.Int).SetString(s, 10); isNum && s[0] >= '0' && s[0] <= '9' {
			require.True(t, ok, "%q is a number of seconds", v)
			if n.Cmp(maxSeconds) > 0 {
				n = maxSeconds
			}
			require.Equal(t, time.Duration(n.Int64())*time.Second, d, v)
			return
		}
		if _, err := http.ParseTime(s); err == nil {
			require.True(t, ok, "%q is an HTTP-date", v)
			return
		}
		require.False(t, ok, "%q is neither seconds nor a date", v)
		require.Zero(t, d)
	})
}

// FuzzRateLimit: any RateLimit field lines give either no hold or one in
// [0, MaxHold] in whole seconds, no member that parses has a negative or
// missing figure, and a well-formed member with r=0 on a line of its own
// holds for at least its t (capped), however many digits t has.
func FuzzRateLimit(f *testing.F) {
	for _, s := range []string{
		`"api";r=0;t=2`, `"api";r=1;t=2`, `"a,b";r=0;t=3, tok;r=0;t=9`, `"bad";r=x;t=1`, `"neg";r=-1;t=1`,
		`"unterminated;r=0;t=9`, `"q\"x";r=0;t=5`, `x;r=0;t=100000000000000000000`, `x;r=0;t=1.5`, ``, ` , ;`,
	} {
		f.Add(s, "7")
	}
	f.Add("", "100000000000000000000")
	maxSeconds := big.NewInt(int64(MaxHold / time.Second))
	f.Fuzz(func(t *testing.T, field, digits string) {
		lines := strings.Split(field, "\n")
		for _, it := range parseSFList(lines) {
			require.NotEmpty(t, it.name)
			for k, v := range it.params {
				require.GreaterOrEqual(t, v, int64(0), "%s=%d", k, v)
			}
		}
		d, ok := rateLimitWait(http.Header{"Ratelimit": lines})
		require.True(t, d >= 0 && d <= MaxHold && d%time.Second == 0, "%v", d)
		if !ok {
			require.Zero(t, d)
		}
		n, isNum := new(big.Int).SetString(digits, 10)
		if !isNum || digits[0] < '0' || digits[0] > '9' {
			return
		}
		d, ok = rateLimitWait(http.Header{"Ratelimit": append(lines, `"mine";r=0;t=`+digits)})
		require.True(t, ok)
		if n.Cmp(maxSeconds) > 0 {
			n = maxSeconds
		}
		require.GreaterOrEqual(t, d, time.Duration(n.Int64())*time.Second)
		require.LessOrEqual(t, d, MaxHold)
	})
}

// policyLimiter records what AdaptToPolicy does to a limiter.
type policyLimiter struct {
	rate  float64
	burst int
}

func (l *policyLimiter) Acquire(context.Context, int) error { return nil }
func (l *policyLimiter) Rate() float64                      { return l.rate }
func (l *policyLimiter) SetRate(r float64) error {
	if !(r > 0) || math.IsInf(r, 0) || r >= l.rate {
		panic("SetRate(" + strconv.FormatFloat(r, 'g', -1, 64) + ") from " + strconv.FormatFloat(l.rate, 'g', -1, 64))
	}
	l.rate = r
	return nil
}
func (l *policyLimiter) Burst() int { return l.burst }
func (l *policyLimiter) SetBurst(b int) error {
	if b < 1 || b >= l.burst {
		panic("SetBurst(" + strconv.Itoa(b) + ") from " + strconv.Itoa(l.burst))
	}
	l.burst = b
	return nil
}

// FuzzRateLimitPolicy: whatever RateLimit-Policy says, AdaptToPolicy only
// ever lowers the rate to a positive finite one, never below its floor
// (the first rate over PolicyFloorFactor), and the burst to one of at least
// 1, to the lowest a well-formed member advertises.
func FuzzRateLimitPolicy(f *testing.F) {
	for _, s := range []string{
		`"p";q=10;w=1;sluice-burst=20`, `"p";q=5;w=2`, `"p";q=0;w=1`, `"p";q=1;w=0`, `"p";q=1;w=100000000000000000000`,
		`"p";q=100000000000000000000;w=1;sluice-burst=100000000000000000000`, `"p";sluice-burst=0`, `"a";q=1;w=1, "b";q=2;w=1`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, field string) {
		lines := strings.Split(field, "\n")
		lim := &policyLimiter{rate: 100, burst: 50}
		rt := &RoundTripper{lim: lim, floor: 100.0 / PolicyFloorFactor}
		rt.adaptTo(http.Header{"Ratelimit-Policy": lines})
		wantRate, wantBurst := 100.0, 50
		for _, it := range parseSFList(lines) {
			q, w := it.params["q"], it.params["w"]
			if q > 0 && w > 0 {
				wantRate = min(wantRate, float64(q)/float64(w))
			}
			if b, ok := it.params["sluice-burst"]; ok && b > 0 && b < int64(wantBurst) {
				wantBurst = int(b)
			}
		}
		require.Equal(t, max(wantRate, 100.0/PolicyFloorFactor), lim.rate)
		require.Equal(t, wantBurst, lim.burst)
	})
}

// FuzzLimitResponseFields: what the middleware and `sluice serve` write
// (internal/limitresponse) reads back here as it means: RateLimit-Policy
// names the policy with q/w never above its rate and its burst; RateLimit
// never more tokens than remain and t ≥ 1; a denial's Retry-After holds a
// Transport at least as long as the store said (capped at MaxHold).
func FuzzLimitResponseFields(f *testing.F) {
	f.Add(10.0, int64(20), "default", 3.7, int64(70), int64(1300), false)
	f.Add(0.4, int64(2), `a"b\c`, 0.0, int64(2500), int64(5000), false)
	f.Add(1e9, int64(1), "x", 1.0, int64(0), int64(1), true)
	f.Add(1.0/3600, int64(5), "hourly", 4.999, int64(3600_000), int64(3600_000), false)
	now := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, rate float64, burst int64, name string, remaining float64, retryMs, resetMs int64, allowed bool) {
		p := store.Policy{Name: name, Rate: rate, Burst: burst}
		if name == "" || p.Validate() != nil || strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r > 0x7e }) {
			return
		}
		items := parseSFList([]string{limitresponse.PolicyField(p)})
		require.Len(t, items, 1)
		it := items[0]
		require.Equal(t, name, it.name)
		q, w := it.params["q"], it.params["w"]
		require.True(t, q >= 1 && w >= 1, "q=%d w=%d", q, w)
		require.LessOrEqual(t, float64(q)/float64(w), rate*(1+1e-9))
		require.Equal(t, burst, it.params["sluice-burst"])

		if math.IsNaN(remaining) {
			remaining = 0
		}
		res := store.Result{
			Allowed:    allowed,
			Remaining:  min(max(remaining, 0), float64(burst)),
			RetryAfter: time.Duration(min(max(retryMs, 0), 1<<40)) * time.Millisecond,
			ResetAfter: time.Duration(min(max(resetMs, 0), 1<<40)) * time.Millisecond,
		}
		h := http.Header{}
		limitresponse.NewPolicy(p).SetHeaders(h, res)
		items = parseSFList(h.Values("Ratelimit"))
		require.Len(t, items, 1, h.Values("Ratelimit"))
		r, t1 := items[0].params["r"], items[0].params["t"]
		require.LessOrEqual(t, float64(r), res.Remaining)
		require.GreaterOrEqual(t, t1, int64(1))
		d, ok := retryAfter(h, now)
		if allowed {
			require.False(t, ok, "an allowed request carries no Retry-After")
			return
		}
		require.True(t, ok)
		require.GreaterOrEqual(t, d, min(res.RetryAfter, MaxHold))
		require.LessOrEqual(t, d, MaxHold)
	})
}
