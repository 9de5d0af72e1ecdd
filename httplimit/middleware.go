package httplimit

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/sluice-go/sluice/internal/decide"
	"github.com/sluice-go/sluice/internal/limitresponse"
	"github.com/sluice-go/sluice/store"
)

// MaxKeyLen is the longest key, in bytes, a Middleware limits by, KeyPrefix
// included (the same bound as `sluice serve`'s /allow). A longer or an empty key is answered
// with 400: either would otherwise be a store's error, and under
// store.FailOpen a way around the limit.
const MaxKeyLen = 256

// DefaultStoreTimeout bounds one store call of a Middleware whose store does
// I/O (Redis, the service), as `sluice serve` does.
const DefaultStoreTimeout = 250 * time.Millisecond

// Middleware limits inbound HTTP requests by key over a store.Store. Create
// it with NewMiddleware and wrap handlers with Handler. It is safe for
// concurrent use; the zero value is not usable. It does not own the store:
// closing it is the caller's business.
//
// Each request costs one token of its key's bucket. An allowed request goes
// on to the wrapped handler with the rate-limit fields already set on its
// response (X-RateLimit-Limit, X-RateLimit-Remaining, RateLimit-Policy,
// RateLimit); a denied one gets 429 with the same fields, Retry-After and a
// JSON body, the answer `sluice serve` gives to /allow. A request whose key
// cannot be found gets 400. When the store fails, the request follows the
// fail mode (see FailMode), and the outage is logged once when it starts and
// once when it ends.
type Middleware struct {
	def    *limitresponse.Policy
	byKey  map[string]*limitresponse.Policy // read-only after NewMiddleware
	key    func(*http.Request) (string, error)
	prefix string
	gate   *decide.Gate // the store call, its timeout, the fail mode and the outage log
}

// MiddlewareOption configures NewMiddleware.
type MiddlewareOption func(*mwConfig)

type mwConfig struct {
	key         func(*http.Request) (string, error)
	trusted     []string
	proxyHeader string
	v6bits      int
	limits      map[string]store.Policy
	prefix      string
	fail        store.FailMode
	timeout     time.Duration
	log         *slog.Logger
	err         error
}

// KeyByIP limits by the client's IP address (the default).
//
// With no trustedProxies the key is the peer's address (the TCP
// connection's), which no header can change. With them (IPs or CIDR
// prefixes, "10.0.0.0/8"), the client is found by one rule: list the hops,
// the entries of the proxy header (ProxyHeader: X-Forwarded-For unless it
// says Forwarded) in order, then the peer; walk back from the peer past
// every trusted proxy; the first address that is not a trusted proxy is the
// client. An entry that names no address ("unknown", an obfuscated "_id",
// anything unreadable) ends the walk at the last address known: the trusted
// proxy that wrote it. When every hop is trusted, the farthest is the client.
// So a header is believed only when a trusted proxy is the peer, only as far
// back as trusted proxies wrote it, and a header the trusted proxies do not
// write is never read: Forwarded is read only when ProxyHeader names it, so
// proxies that write Forwarded need ProxyHeader("Forwarded").
//
// The address is normalized before it becomes the key: an IPv4-mapped IPv6
// address is the IPv4 address, IPv6 is in canonical form with its zone
// dropped, ports go ("[2001:db8::1]:4711", "192.0.2.1:80"). An IPv6 client
// is keyed by its network, a /64 by default (see DefaultIPv6Prefix and
// IPv6Prefix), as "2001:db8:1:2::/64"; Limits for such a client names that.
//
// A request whose peer is not an IP (a server on a Unix socket) gets 400
// (ErrNoClientIP): key such servers by header or function.
func KeyByIP(trustedProxies ...string) MiddlewareOption {
	return func(c *mwConfig) { c.key, c.trusted = nil, trustedProxies }
}

// KeyByHeader limits by the value of a request header (an API key, a tenant
// id). A request without the header gets 400.
func KeyByHeader(name string) MiddlewareOption {
	canon := http.CanonicalHeaderKey(name)
	return KeyFunc(func(r *http.Request) (string, error) {
		if v := r.Header[canon]; len(v) > 0 && v[0] != "" {
			return v[0], nil
		}
		return "", fmt.Errorf("httplimit: missing %s header", canon)
	})
}

// KeyFunc limits by the key f returns. An error from f answers the request
// with 400 and the error's text.
func KeyFunc(f func(*http.Request) (string, error)) MiddlewareOption {
	return func(c *mwConfig) { c.key = f }
}

// Limits gives some keys a policy of their own; other keys get the
// default policy passed to NewMiddleware. A policy without a Name is named
// after its key.
func Limits(byKey map[string]store.Policy) MiddlewareOption {
	return func(c *mwConfig) { c.limits = byKey }
}

// KeyPrefix prefixes every key in the store. Middlewares that share one
// store with different policies (one per route, say) need distinct prefixes,
// or the same key would be counted under two policies at once. It costs one
// small allocation per request.
func KeyPrefix(prefix string) MiddlewareOption {
	return func(c *mwConfig) { c.prefix = prefix }
}

// FailMode says what a request gets while the store fails:
// store.FailOpen (the default, as is the zero FailMode) lets it through;
// store.FailClosed answers 429 with Retry-After: 1.
func FailMode(m store.FailMode) MiddlewareOption { return func(c *mwConfig) { c.fail = m } }

// StoreTimeout bounds each call to a store that does I/O (default
// DefaultStoreTimeout). In-process stores (store.Memory, shmstore.Store)
// are never bounded: they do not wait.
func StoreTimeout(d time.Duration) MiddlewareOption {
	return func(c *mwConfig) {
		if d <= 0 {
			c.err = fmt.Errorf("httplimit: store timeout %v: must be positive", d)
		}
		c.timeout = d
	}
}

// Logger sets where store outages are logged (default slog.Default()).
func Logger(l *slog.Logger) MiddlewareOption { return func(c *mwConfig) { c.log = l } }

// NewMiddleware returns a Middleware that limits each key to p over s. The
// policy is named "default" when p.Name is empty. A policy name must be
// printable ASCII (it is sent in RateLimit-Policy), the rule `sluice serve`
// applies too.
func NewMiddleware(s store.Store, p store.Policy, opts ...MiddlewareOption) (*Middleware, error) {
	if s == nil {
		return nil, errors.New("httplimit: store is nil")
	}
	c := mwConfig{timeout: DefaultStoreTimeout, proxyHeader: headerXFF, v6bits: DefaultIPv6Prefix}
	for _, o := range opts {
		o(&c)
	}
	if c.err != nil {
		return nil, c.err
	}
	if len(c.prefix) >= MaxKeyLen {
		return nil, fmt.Errorf("httplimit: key prefix of %d bytes leaves no room for a key (MaxKeyLen %d)", len(c.prefix), MaxKeyLen)
	}
	def, err := newPolicy(p, "default")
	if err != nil {
		return nil, err
	}
	m := &Middleware{def: def, prefix: c.prefix, key: c.key,
		gate: decide.New(decide.Config{Store: s, Timeout: c.timeout, Fail: c.fail, Log: c.log, LogPrefix: "httplimit: "})}
	if m.key == nil {
		k, err := newIPKeyer(c.trusted, c.proxyHeader, c.v6bits)
		if err != nil {
			return nil, err
		}
		m.key = k.key
	}
	if len(c.limits) > 0 {
		m.byKey = make(map[string]*limitresponse.Policy, len(c.limits))
		for k, kp := range c.limits {
			e, err := newPolicy(kp, k)
			if err != nil {
				return nil, fmt.Errorf("httplimit: limit for key %q: %w", k, err)
			}
			m.byKey[k] = e
		}
	}
	return m, nil
}

// newPolicy validates p and names it name when it has no name.
func newPolicy(p store.Policy, name string) (*limitresponse.Policy, error) {
	if p.Name == "" {
		p.Name = name
	}
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("httplimit: policy %q: %w", p.Name, err)
	}
	if err := limitresponse.CheckName(p.Name); err != nil {
		return nil, fmt.Errorf("httplimit: %w", err)
	}
	return limitresponse.NewPolicy(p), nil
}

// Handler returns next wrapped in the limit.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if m.allow(w, r) {
			next.ServeHTTP(w, r)
		}
	})
}

// allow decides r, writes the refusal when there is one, and reports
// whether r may go on.
func (m *Middleware) allow(w http.ResponseWriter, r *http.Request) bool {
	key, err := m.key(r)
	switch {
	case err != nil:
		limitresponse.WriteError(w, http.StatusBadRequest, err.Error())
		return false
	case key == "":
		limitresponse.WriteError(w, http.StatusBadRequest, "httplimit: empty rate-limit key")
		return false
	case len(m.prefix)+len(key) > MaxKeyLen:
		limitresponse.WriteError(w, http.StatusBadRequest, "httplimit: rate-limit key over "+strconv.Itoa(MaxKeyLen-len(m.prefix))+" bytes")
		return false
	}
	e := m.def
	if m.byKey != nil {
		if pe, ok := m.byKey[key]; ok {
			e = pe
		}
	}
	if m.prefix != "" {
		key = m.prefix + key
	}
	var d decide.Decision
	m.gate.Allow(r.Context(), key, 1, e.Policy(), &d)
	switch d.Outcome {
	case decide.Gone:
		return false // the client went away mid-call: nobody to answer
	case decide.Refused: // cannot happen: cost 1 never exceeds a valid burst
		limitresponse.WriteError(w, http.StatusBadRequest, d.Err.Error())
		return false
	case decide.Degraded: // an outage's edges are the gate's to log
		if d.Allowed {
			e.SetDegradedHeaders(w.Header(), true)
			return true
		}
		e.WriteDegraded(w, false)
		return false
	}
	if !d.Allowed {
		e.WriteDecision(w, d.Result, false)
		return false
	}
	e.SetHeaders(w.Header(), d.Result)
	return true
}
