package redisstore

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// OpenSentinel connects to the master that Redis Sentinel names, and
// follows it through a failover: the URL is
//
//	redis-sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER[/DB][?sentinel_password=P&sentinel_username=U]
//
// (redis-sentinels:// for TLS to the sentinels and the servers). HOST:PORT
// are sentinels, MASTER the name they monitor the master by; USER and
// PASSWORD are Redis AUTH for the master (and replicas), the query's the
// sentinels' own when they require one. As Open, nothing is ever replayed.
// During a failover, calls fail (answered per -fail behind a breaker) until
// the sentinels have promoted a replica; the breaker's probe then finds the
// new master (see Ping), and calls resume.
func OpenSentinel(rawURL string, opts ...Option) (*Store, error) {
	opt, err := ParseSentinelURL(rawURL)
	if err != nil {
		return nil, err
	}
	o := collect(opts)
	failFast(o.timeout, &opt.MaxRetries, &opt.DialerRetries, &opt.Protocol,
		&opt.DialTimeout, &opt.ReadTimeout, &opt.WriteTimeout, &opt.ContextTimeoutEnabled, &opt.DisableIdentity)
	return renewable(func() *conn { return &conn{c: redis.NewFailoverClient(opt)} }, o.timeout), nil
}

// ParseSentinelURL parses OpenSentinel's URL into go-redis's options. Its
// errors name the part at fault.
func ParseSentinelURL(rawURL string) (*redis.FailoverOptions, error) {
	bad := func(format string, args ...any) (*redis.FailoverOptions, error) {
		return nil, fmt.Errorf("redisstore: sentinel URL %q: %s (want redis-sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER[/DB])",
			redact(rawURL), fmt.Sprintf(format, args...))
	}
	// Why not url.Parse alone: it takes one host, and its port check
	// refuses some lists of several; the sentinels are split here first.
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return bad("no scheme")
	}
	authority, pathQuery := rest, ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		authority, pathQuery = rest[:i], rest[i:]
	}
	hosts := authority
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		hosts = authority[i+1:]
		authority = authority[:i+1] + "sentinels"
	} else {
		authority = "sentinels"
	}
	u, err := url.Parse(scheme + "://" + authority + pathQuery)
	if err != nil {
		return bad("%v", err)
	}
	opt := &redis.FailoverOptions{}
	switch u.Scheme {
	case "redis-sentinel":
	case "redis-sentinels":
		opt.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	default:
		return bad("scheme %q", u.Scheme)
	}
	if u.User != nil {
		opt.Username = u.User.Username()
		opt.Password, _ = u.User.Password()
	}
	for _, a := range strings.Split(hosts, ",") {
		h, p, err := net.SplitHostPort(a)
		if err != nil || h == "" || p == "" {
			return bad("sentinel address %q is not HOST:PORT", a)
		}
		opt.SentinelAddrs = append(opt.SentinelAddrs, a)
	}
	parts := strings.Split(strings.Trim(u.Path, "/"), "/")
	switch {
	case len(parts) == 0 || parts[0] == "":
		return bad("no master name")
	case len(parts) > 2:
		return bad("path %q: want /MASTER or /MASTER/DB", u.Path)
	}
	opt.MasterName = parts[0]
	if len(parts) == 2 {
		if opt.DB, err = strconv.Atoi(parts[1]); err != nil || opt.DB < 0 {
			return bad("database %q is not a number", parts[1])
		}
	}
	for k, v := range u.Query() {
		switch k {
		case "sentinel_password":
			opt.SentinelPassword = v[len(v)-1]
		case "sentinel_username":
			opt.SentinelUsername = v[len(v)-1]
		default:
			return bad("unknown parameter %q (want sentinel_password, sentinel_username)", k)
		}
	}
	if opt.TLSConfig != nil {
		h, _, _ := net.SplitHostPort(opt.SentinelAddrs[0])
		opt.TLSConfig.ServerName = h
	}
	return opt, nil
}

// redact hides a URL's password in an error message.
func redact(rawURL string) string {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return rawURL
	}
	end := len(rest)
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		end = i
	}
	at := strings.LastIndexByte(rest[:end], '@')
	if at < 0 {
		return rawURL
	}
	user, _, hasPass := strings.Cut(rest[:at], ":")
	if !hasPass {
		return rawURL
	}
	return scheme + "://" + user + ":xxxxx" + rest[at:]
}
