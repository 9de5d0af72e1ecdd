package httplimit_test

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/httplimit"
	"github.com/sluice-go/sluice/store"
)

// keyFor sends one request from remote with the given header lines through
// a middleware built with opts and returns the status and the key the
// request was counted under ("" when it reached no store).
func keyFor(t *testing.T, remote string, hdr http.Header, opts ...httplimit.MiddlewareOption) (int, string) {
	t.Helper()
	mem, _ := memory(t)
	counted := &keyStore{Store: mem}
	lim, err := httplimit.NewMiddleware(counted, store.Policy{Rate: 1, Burst: 100}, opts...)
	require.NoError(t, err)
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.RemoteAddr = remote
	for k, vs := range hdr {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	w := httptest.NewRecorder()
	lim.Handler(hello).ServeHTTP(w, req)
	key, _ := counted.last.Load().(string)
	return w.Code, key
}

// TestForgedForwardedBehindXFFProxy: a trusted proxy that appends only
// X-Forwarded-For (nginx, HAProxy and cloud load balancers by default) and a
// client that sends a Forwarded header of its own with a new address each
// time: the client is still one key, so at 1/s, burst 1, with the clock
// stopped, one request of 100 passes.
func TestForgedForwardedBehindXFFProxy(t *testing.T) {
	mem, _ := memory(t)
	lim, err := httplimit.NewMiddleware(mem, store.Policy{Rate: 1, Burst: 1}, httplimit.KeyByIP("10.0.0.0/8"))
	require.NoError(t, err)
	h := lim.Handler(hello)
	passed := 0
	for i := range 100 {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.RemoteAddr = "10.0.0.2:41000" // the proxy
		req.Header.Set("Forwarded", fmt.Sprintf("for=198.18.%d.%d", rand.IntN(256), rand.IntN(256)))
		req.Header.Set("X-Forwarded-For", "203.0.113.9") // what the proxy saw
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		require.Contains(t, []int{200, 429}, w.Code, "request %d: %s", i, w.Body)
		if w.Code == 200 {
			passed++
		}
	}
	assert.Equal(t, 1, passed)
}

// TestForgedForwardedThroughReverseProxy is the same break end to end on
// loopback: a real httputil.ReverseProxy (which appends X-Forwarded-For and
// leaves Forwarded alone) in front of the middleware, trusted as 127.0.0.0/8.
func TestForgedForwardedThroughReverseProxy(t *testing.T) {
	mem, _ := memory(t)
	lim, err := httplimit.NewMiddleware(mem, store.Policy{Rate: 1, Burst: 1}, httplimit.KeyByIP("127.0.0.0/8", "::1"))
	require.NoError(t, err)
	app := serve(t, lim.Handler(hello))
	target, err := url.Parse(app.URL)
	require.NoError(t, err)
	proxy := serve(t, httputil.NewSingleHostReverseProxy(target))

	codes := map[int]int{}
	for i := range 20 {
		codes[get(t, proxy.URL, "Forwarded", fmt.Sprintf("for=198.18.0.%d", i)).status]++
	}
	assert.Equal(t, map[int]int{200: 1, 429: 19}, codes)
}

// TestForwardedUnknownIsNo400: "unknown" and obfuscated hops never turn a
// request into a 400, whoever wrote them.
func TestForwardedUnknownIsNo400(t *testing.T) {
	for _, fwd := range []string{"for=unknown", "for=_hidden", `for="_x:_y"`, "for=", "proto=https", `for="`} {
		code, key := keyFor(t, "10.0.0.2:41000", http.Header{"Forwarded": {fwd}, "X-Forwarded-For": {"203.0.113.9"}},
			httplimit.KeyByIP("10.0.0.0/8"))
		assert.Equal(t, 200, code, fwd)
		assert.Equal(t, "203.0.113.9", key, fwd)
	}
}

// TestClientIPNormalized: one client however its address is spelled is one
// key: IPv4-mapped IPv6 is IPv4, case and zeros are canonical, the zone and
// the port go.
func TestClientIPNormalized(t *testing.T) {
	for _, c := range []struct{ remote, want string }{
		{"[::ffff:192.0.2.1]:4711", "192.0.2.1"},
		{"[::FFFF:c000:201]:80", "192.0.2.1"},
		{"192.0.2.1:80", "192.0.2.1"},
		{"192.0.2.1", "192.0.2.1"},
	} {
		code, key := keyFor(t, c.remote, nil)
		assert.Equal(t, 200, code, c.remote)
		assert.Equal(t, c.want, key, c.remote)
	}
	for _, xff := range []string{"2001:DB8::1", "2001:db8:0:0:0:0:0:1", "[2001:db8::1]:4711", "fe80::1%eth0"} {
		_, key := keyFor(t, "10.0.0.2:41000", http.Header{"X-Forwarded-For": {xff}}, httplimit.KeyByIP("10.0.0.0/8"))
		assert.NotEqual(t, xff, key, "%s is keyed as written", xff)
	}
	_, k1 := keyFor(t, "10.0.0.2:41000", http.Header{"X-Forwarded-For": {"::ffff:203.0.113.9"}}, httplimit.KeyByIP("10.0.0.0/8"))
	_, k2 := keyFor(t, "10.0.0.2:41000", http.Header{"X-Forwarded-For": {"203.0.113.9:5000"}}, httplimit.KeyByIP("10.0.0.0/8"))
	assert.Equal(t, "203.0.113.9", k1)
	assert.Equal(t, "203.0.113.9", k2)
}

// TestClientIPLayouts runs the rule against the headers real proxies write.
// The client is 203.0.113.9 (or 2001:db8:cafe::17), the proxy next to the
// application 10.0.0.2, a CDN in front of it 198.51.100.0/24; 1.1.1.1 and
// friends are what the client forges.
func TestClientIPLayouts(t *testing.T) {
	const proxy = "10.0.0.2:41000"
	viaXFF := []httplimit.MiddlewareOption{httplimit.KeyByIP("10.0.0.0/8")}
	viaFwd := []httplimit.MiddlewareOption{httplimit.KeyByIP("10.0.0.0/8"), httplimit.ProxyHeader("Forwarded")}
	chain := []httplimit.MiddlewareOption{httplimit.KeyByIP("10.0.0.0/8", "198.51.100.0/24")}
	chainFwd := append([]httplimit.MiddlewareOption{httplimit.ProxyHeader("forwarded")}, chain...)
	xff := func(lines ...string) http.Header { return http.Header{"X-Forwarded-For": lines} }
	fwd := func(lines ...string) http.Header { return http.Header{"Forwarded": lines} }
	cases := []struct {
		name   string
		remote string
		hdr    http.Header
		opts   []httplimit.MiddlewareOption
		want   string
	}{
		// No trust, or an untrusted peer: headers are never read.
		{"no proxies: headers ignored", "198.51.100.7:5000", xff("1.1.1.1"), nil, "198.51.100.7"},
		{"untrusted peer: XFF ignored", "198.51.100.7:5000", xff("1.1.1.1"), viaXFF, "198.51.100.7"},
		{"untrusted peer: Forwarded ignored", "198.51.100.7:5000", fwd("for=1.1.1.1"), viaFwd, "198.51.100.7"},
		{"trusted peer, no header", proxy, nil, viaXFF, "10.0.0.2"},

		// nginx: proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for
		// joins what the client sent and the address it saw with ", ".
		{"nginx", proxy, xff("203.0.113.9"), viaXFF, "203.0.113.9"},
		{"nginx, client forged XFF", proxy, xff("1.1.1.1, 203.0.113.9"), viaXFF, "203.0.113.9"},
		{"nginx, client forged two XFF lines", proxy, xff("1.1.1.1, 2.2.2.2, 203.0.113.9"), viaXFF, "203.0.113.9"},
		{"nginx, client forged a trusted address", proxy, xff("10.9.9.9, 203.0.113.9"), viaXFF, "203.0.113.9"},
		{"nginx, client forged Forwarded", proxy, http.Header{"Forwarded": {"for=1.1.1.1"}, "X-Forwarded-For": {"203.0.113.9"}}, viaXFF, "203.0.113.9"},
		{"nginx, IPv6 client", proxy, xff("2001:db8:cafe::17"), viaXFF, "2001:db8:cafe::/64"},
		{"nginx over IPv6", "[fd00::2]:41000", xff("203.0.113.9"), []httplimit.MiddlewareOption{httplimit.KeyByIP("fd00::/8")}, "203.0.113.9"},

		// HAProxy: option forwardfor adds a header line of its own after
		// the client's; an IPv6 client is written bare.
		{"HAProxy", proxy, xff("203.0.113.9"), viaXFF, "203.0.113.9"},
		{"HAProxy, client forged XFF", proxy, xff("1.1.1.1", "203.0.113.9"), viaXFF, "203.0.113.9"},
		{"HAProxy, client forged a list", proxy, xff("1.1.1.1, 2.2.2.2", "203.0.113.9"), viaXFF, "203.0.113.9"},
		{"HAProxy, IPv6 client", proxy, xff("1.1.1.1", "2001:db8:cafe::17"), viaXFF, "2001:db8:cafe::/64"},

		// Load balancers that write the client's port too.
		{"XFF with port", proxy, xff("203.0.113.9:51234"), viaXFF, "203.0.113.9"},
		{"XFF with bracketed IPv6 and port", proxy, xff("[2001:db8:cafe::17]:51234"), viaXFF, "2001:db8:cafe::/64"},

		// An RFC 7239 proxy (ProxyHeader("Forwarded")).
		{"RFC 7239", proxy, fwd("for=203.0.113.9;proto=https;by=10.0.0.2"), viaFwd, "203.0.113.9"},
		{"RFC 7239, IPv6 with port", proxy, fwd(`for="[2001:db8:cafe::17]:4711";proto=https`), viaFwd, "2001:db8:cafe::/64"},
		{"RFC 7239, FOR in capitals", proxy, fwd(`For="203.0.113.9:4711"`), viaFwd, "203.0.113.9"},
		{"RFC 7239, client forged Forwarded", proxy, fwd("for=1.1.1.1, for=203.0.113.9;proto=http"), viaFwd, "203.0.113.9"},
		{"RFC 7239, forged line of its own", proxy, fwd("for=1.1.1.1", "for=203.0.113.9"), viaFwd, "203.0.113.9"},
		{"RFC 7239, forged unterminated quote", proxy, fwd(`for="1.1.1.1, for=203.0.113.9`), viaFwd, "203.0.113.9"},
		{"RFC 7239, forged escaped quote", proxy, fwd(`for="1.1.1.1\", for=203.0.113.9`), viaFwd, "203.0.113.9"},
		{"RFC 7239, quoted comma in the proxy's element", proxy, fwd(`for=203.0.113.9;host="a, for=1.1.1.1"`), viaFwd, "203.0.113.9"},
		{"RFC 7239, client forged XFF", proxy, http.Header{"X-Forwarded-For": {"1.1.1.1"}, "Forwarded": {"for=203.0.113.9"}}, viaFwd, "203.0.113.9"},
		{"RFC 7239, unknown", proxy, fwd("for=1.1.1.1, for=unknown"), viaFwd, "10.0.0.2"},
		{"RFC 7239, obfuscated", proxy, fwd(`for=1.1.1.1, for="_gazonk"`), viaFwd, "10.0.0.2"},
		{"RFC 7239, obfuscated port", proxy, fwd(`for="203.0.113.9:_p1"`), viaFwd, "203.0.113.9"},
		{"RFC 7239, no for=", proxy, fwd("for=1.1.1.1, proto=https"), viaFwd, "10.0.0.2"},
		{"RFC 7239, for= twice", proxy, fwd("for=203.0.113.9;for=1.1.1.1"), viaFwd, "10.0.0.2"},

		// Two chained proxies: a CDN, then nginx, both appending XFF.
		{"chain", proxy, xff("203.0.113.9, 198.51.100.20"), chain, "203.0.113.9"},
		{"chain, client forged XFF", proxy, xff("1.1.1.1, 203.0.113.9, 198.51.100.20"), chain, "203.0.113.9"},
		{"chain, client claims to be the CDN", proxy, xff("198.51.100.99, 203.0.113.9, 198.51.100.20"), chain, "203.0.113.9"},
		{"chain, client skips the CDN", proxy, xff("203.0.113.50, 198.18.0.1"), chain, "198.18.0.1"},
		{"chain, every hop trusted", proxy, xff("198.51.100.20"), chain, "198.51.100.20"},
		{"chain, unknown behind the CDN", proxy, xff("unknown, 198.51.100.20"), chain, "198.51.100.20"},
		{"chain, unspecified behind the CDN", proxy, xff("1.1.1.1, ::ffff:0.0.0.0, 198.51.100.20"), chain, "198.51.100.20"},
		{"chain, unspecified with a zone behind the CDN", proxy, xff("1.1.1.1, ::%0, 198.51.100.20"), chain, "198.51.100.20"},
		{"chain, garbage behind the CDN", proxy, xff("1.1.1.1, not-an-ip, 198.51.100.20"), chain, "198.51.100.20"},
		{"chain of RFC 7239 proxies", proxy, fwd("for=1.1.1.1, for=203.0.113.9, for=198.51.100.20;by=10.0.0.2"), chainFwd, "203.0.113.9"},
		{"chain, empty entries", proxy, xff(", 203.0.113.9,, 198.51.100.20 ,"), chain, "203.0.113.9"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, key := keyFor(t, c.remote, c.hdr, c.opts...)
			require.Equal(t, 200, code)
			assert.Equal(t, c.want, key)
		})
	}
}

// TestIPv6Prefix: an IPv6 client is one key per /64 by default, per the
// prefix asked for otherwise; IPv4 is always one key per address.
func TestIPv6Prefix(t *testing.T) {
	cases := []struct {
		remote string
		opts   []httplimit.MiddlewareOption
		want   string
	}{
		{"[2001:db8:1:2:aaaa::1]:1", nil, "2001:db8:1:2::/64"},
		{"[2001:DB8:1:2:bbbb::2]:1", nil, "2001:db8:1:2::/64"},
		{"[fe80::1%eth0]:1", nil, "fe80::/64"},
		{"[2001:db8:1:2:aaaa::1]:1", []httplimit.MiddlewareOption{httplimit.IPv6Prefix(48)}, "2001:db8:1::/48"},
		{"[2001:db8:1:2:aaaa::1]:1", []httplimit.MiddlewareOption{httplimit.IPv6Prefix(128)}, "2001:db8:1:2:aaaa::1"},
		{"[2001:0DB8:0001:0002:AAAA:0:0:1]:1", []httplimit.MiddlewareOption{httplimit.IPv6Prefix(128)}, "2001:db8:1:2:aaaa::1"},
		{"[fe80::1%eth0]:1", []httplimit.MiddlewareOption{httplimit.IPv6Prefix(128)}, "fe80::1"},
		{"[::ffff:192.0.2.1]:1", []httplimit.MiddlewareOption{httplimit.IPv6Prefix(8)}, "192.0.2.1"},
	}
	for _, c := range cases {
		code, key := keyFor(t, c.remote, nil, c.opts...)
		require.Equal(t, 200, code, c.remote)
		assert.Equal(t, c.want, key, c.remote)
	}
}

// TestTrustedProxyForms: trusted proxies are compared normalized too.
func TestTrustedProxyForms(t *testing.T) {
	for _, trusted := range []string{"10.0.0.2", "::ffff:10.0.0.2", "::ffff:10.0.0.0/104", "10.0.0.0/8", "10.0.0.2/8"} {
		_, key := keyFor(t, "[::ffff:10.0.0.2]:41000", http.Header{"X-Forwarded-For": {"203.0.113.9"}}, httplimit.KeyByIP(trusted))
		assert.Equal(t, "203.0.113.9", key, trusted)
	}
	_, key := keyFor(t, "[fe80::1%eth0]:41000", http.Header{"X-Forwarded-For": {"203.0.113.9"}}, httplimit.KeyByIP("fe80::1%eth1"))
	assert.Equal(t, "203.0.113.9", key, "the zone is no part of the address")
}

func TestClientIPErrors(t *testing.T) {
	code, key := keyFor(t, "pipe", nil)
	assert.Equal(t, 400, code)
	assert.Empty(t, key)
	code, _ = keyFor(t, "@", http.Header{"X-Forwarded-For": {"203.0.113.9"}}, httplimit.KeyByIP("0.0.0.0/0"))
	assert.Equal(t, 400, code, "a peer that is not an IP is trusted by no prefix")

	mem, _ := memory(t)
	p := store.Policy{Rate: 1, Burst: 1}
	for _, c := range []struct {
		opt  httplimit.MiddlewareOption
		want string // "" for no error
	}{
		{httplimit.KeyByIP("10.0.0.0/33"), `trusted proxy "10.0.0.0/33"`},
		{httplimit.ProxyHeader("X-Real-IP"), `proxy header "X-Real-IP": want X-Forwarded-For or Forwarded`},
		{httplimit.IPv6Prefix(0), "IPv6 prefix /0"},
		{httplimit.IPv6Prefix(129), "IPv6 prefix /129"},
		{httplimit.ProxyHeader("x-forwarded-for"), ""},
	} {
		_, err := httplimit.NewMiddleware(mem, p, c.opt)
		if c.want == "" {
			assert.NoError(t, err)
			continue
		}
		assert.ErrorContains(t, err, c.want)
	}
}
