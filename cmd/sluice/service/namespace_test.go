package service_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/redisstore"
	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/sharedbucket"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/shmstore"
)

const edgeRules = `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 5}
`

// Ten /allow calls naming an Envoy bucket's key spend nothing from it: the
// address's next ShouldRateLimit is OK with the whole burst less one left.
func TestAllowCannotDrainAnEnvoyBucket(t *testing.T) {
	f := newRLS(t, edgeRules, nil)
	for range 10 {
		f.get(t, "/allow?key="+url.QueryEscape("rls:edge|remote_address=198.51.100.7|5/second"))
	}
	r := f.ask(t, "edge", 0, desc("remote_address", "198.51.100.7"))
	require.Equal(t, OK, r.OverallCode)
	assert.EqualValues(t, 4, r.Statuses[0].LimitRemaining)
}

// nsRules: every rule has the limit of the /allow default policy (5 a day),
// so on the shm store every bucket of the test lives in one table: only the
// keys keep them apart. A day's refill is slow enough that answers do not
// depend on when a request arrives.
const nsRules = `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: path
    value: /img/*
    share_threshold: true
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: tenant
    descriptors:
      - key: user
        rate_limit: {unit: day, requests_per_unit: 5}
---
domain: http
descriptors:
  - key: key
    value: tenant-a
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: key
    value: t-*
    rate_limit: {unit: day, requests_per_unit: 5}
---
domain: "a|b=c%"
descriptors:
  - key: "k|="
    rate_limit: {unit: day, requests_per_unit: 5}
`

// nsServer is one Server on a store, over loopback HTTP and gRPC.
type nsServer struct {
	*rlsFixture
	cfg *rules.Config
}

func newNSServer(t *testing.T, st store.Store) *nsServer {
	t.Helper()
	c, err := rules.Parse("ns.yaml", []byte(nsRules))
	require.NoError(t, err)
	srv, err := service.New(service.Config{Store: st, Default: store.Policy{Rate: 5.0 / 86400, Burst: 5}, Rules: c,
		Fail: store.FailClosed, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	return &nsServer{rlsFixture: &rlsFixture{fixture: &fixture{srv: srv, ts: ts}, rls: serveGRPC(t, srv)}, cfg: c}
}

// nsDescriptor is one descriptor of the checked workload.
type nsDescriptor struct {
	domain string
	kv     []string
}

// nsWorkload is the gRPC traffic whose answers must not change: every rule
// of nsRules, with values that hold the key format's separators.
func nsWorkload() []nsDescriptor {
	var w []nsDescriptor
	for _, ip := range []string{"198.51.100.7", "198.51.100.8", "2001:db8::1"} {
		w = append(w, nsDescriptor{"edge", []string{"remote_address", ip}})
	}
	for _, p := range []string{"/img/a.png", "/img/*", "/img/|5/day"} {
		w = append(w, nsDescriptor{"edge", []string{"path", p}})
	}
	for _, u := range []string{"ann", "bo|b", "c=d", "%7C"} {
		w = append(w, nsDescriptor{"edge", []string{"tenant", "acme", "user", u}})
	}
	for _, k := range []string{"tenant-a", "t-1", "t-|x", "t-*"} {
		w = append(w, nsDescriptor{"http", []string{"key", k}})
	}
	w = append(w, nsDescriptor{"a|b=c%", []string{"k|=", "v"}}, nsDescriptor{"a|b=c%", []string{"k|=", "v|5/day"}})
	return w
}

func (d nsDescriptor) entries() []rules.KV {
	var e []rules.KV
	for i := 0; i+1 < len(d.kv); i += 2 {
		e = append(e, rules.KV{Key: d.kv[i], Value: d.kv[i+1]})
	}
	return e
}

// spellings are strings a hostile caller would try for d's bucket: the
// key as this code and older code write it, for both APIs, raw and
// escaped, digested, and the values alone.
func (d nsDescriptor) spellings(c *rules.Config) []string {
	e := d.entries()
	raw := d.domain
	for _, kv := range e {
		raw += "|" + kv.Key + "=" + kv.Value
	}
	out := []string{"rls:" + raw + "|5/day", "allow:" + raw + "|5/day", raw, "rls:" + raw + "|override:5/day"}
	if r := rules.Match(c, d.domain, e); r != nil {
		for _, api := range []rules.API{rules.RLS, rules.Allow} {
			k := rules.BucketKey(api, r, e)
			sum := sha256.Sum256([]byte(k))
			out = append(out, k, "~"+hex.EncodeToString(sum[:]), string(api)+"#"+hex.EncodeToString(sum[:]))
		}
		o := *r
		o.Override = true
		out = append(out, rules.BucketKey(rules.RLS, &o, e))
	}
	for _, kv := range e {
		out = append(out, kv.Value, "~"+kv.Value)
	}
	return out
}

// mutate changes s the way an attacker probing the encoding would: a
// separator or an escape inserted, a cut, a doubled tail.
func mutate(rng *rand.Rand, s string) string {
	bits := []string{"|", "=", "%", "%7C", "%3D", "%25", "%2A", "*", "~", "#", ":", "{", "}", "\x00", "\xff", "rls:", "allow:"}
	switch i := rng.IntN(len(s) + 1); rng.IntN(4) {
	case 0:
		return s[:i] + bits[rng.IntN(len(bits))] + s[i:]
	case 1:
		return s[:i]
	case 2:
		return s + s[i:]
	default:
		b := make([]byte, rng.IntN(300))
		for j := range b {
			b[j] = byte(rng.UintN(256))
		}
		return string(b)
	}
}

// answer is what the property compares: per descriptor, the code and the
// whole tokens left (a day's refill keeps both independent of timing).
func nsAnswer(r *rlsv3.RateLimitResponse) string {
	s := r.OverallCode.String()
	for _, st := range r.Statuses {
		s += fmt.Sprintf(" %v/%d", st.Code, st.LimitRemaining)
	}
	return s
}

// TestAllowNeverChangesGRPCAnswers is the namespace property: the same
// gRPC traffic, sent to a server alone and to one that also receives
// hostile /allow keys (and gRPC limit overrides in any domain) built from
// the gRPC buckets' own keys, gets the same answers, on every store.
func TestAllowNeverChangesGRPCAnswers(t *testing.T) {
	stores := map[string]func(t *testing.T) (a, b store.Store){
		"memory": func(t *testing.T) (store.Store, store.Store) {
			a, b := store.NewMemory(), store.NewMemory()
			t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
			return a, b
		},
		"shm": func(t *testing.T) (store.Store, store.Store) {
			a, err := shmstore.Open(t.TempDir(), sharedbucket.WithSlots(1024))
			require.NoError(t, err)
			b, err := shmstore.Open(t.TempDir(), sharedbucket.WithSlots(1024))
			require.NoError(t, err)
			t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
			return a, b
		},
		"redis": func(t *testing.T) (store.Store, store.Store) {
			rs := redistest.Start(t)
			a, err := redisstore.Open("redis://" + rs.Addr() + "/0")
			require.NoError(t, err)
			b, err := redisstore.Open("redis://" + rs.Addr() + "/1")
			require.NoError(t, err)
			t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
			return a, b
		},
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			for seed := range uint64(3) {
				sa, sb := open(t)
				alone, attacked := newNSServer(t, sa), newNSServer(t, sb)
				rng := rand.New(rand.NewPCG(seed, 22))
				w := nsWorkload()
				var sent []string
				for step := range 120 {
					d := w[rng.IntN(len(w))]
					for range rng.IntN(4) {
						// Noise: an /allow key built from some bucket's spelling.
						v := w[rng.IntN(len(w))]
						sp := v.spellings(attacked.cfg)
						k := sp[rng.IntN(len(sp))]
						if rng.IntN(3) == 0 {
							k = mutate(rng, k)
						}
						n := 1 + rng.IntN(6)
						attacked.get(t, "/allow?key="+url.QueryEscape(k)+"&n="+strconv.Itoa(n))
						sent = append(sent, k)
					}
					if rng.IntN(3) == 0 {
						// Noise: a limit override of the same limit, in the
						// descriptor's domain or a domain spelled to look like
						// another's key.
						v := w[rng.IntN(len(w))]
						dom := []string{v.domain, v.domain + "|" + v.kv[0] + "=" + v.kv[1], "rls:" + v.domain, mutate(rng, v.domain)}[rng.IntN(4)]
						od := desc(v.kv...)
						od.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_DAY}
						if dom = strings.ToValidUTF8(dom, "?"); dom != "" { // protobuf strings are UTF-8
							attacked.ask(t, dom, uint32(1+rng.IntN(5)), od)
						}
					}
					want := nsAnswer(alone.ask(t, d.domain, 0, desc(d.kv...)))
					got := nsAnswer(attacked.ask(t, d.domain, 0, desc(d.kv...)))
					require.Equal(t, want, got, "seed %d step %d: %s %q after /allow keys %q", seed, step, d.domain, d.kv, sent)
				}
			}
		})
	}
}
