package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/lease"
	"github.com/sluice-go/sluice/store"
)

func leaseFixture(t *testing.T, on bool) *fixture {
	t.Helper()
	return newFixture(t, func(cfg *service.Config) {
		cfg.Limits = map[string]store.Policy{"tenant-a": {Name: "tenant-a", Rate: 100, Burst: 100}}
		if on {
			cfg.Leases = &service.LeaseConfig{NoLearning: true}
		}
	})
}

// POST /lease: two replicas share a policy max-min fair; the HTTP
// transport of package lease reads the answers.
func TestLeaseEndpoint(t *testing.T) {
	f := leaseFixture(t, true)
	tr := lease.HTTP(f.ts.URL, f.ts.Client())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a, err := tr.Renew(ctx, &lease.Request{Holder: "a", Keys: []lease.KeyRequest{{Policy: "tenant-a", Key: "k", Want: 80}}})
	require.NoError(t, err)
	assert.InDelta(t, 80, a.Keys[0].Rate, 0.01, "alone, a gets its demand")
	b, err := tr.Renew(ctx, &lease.Request{Holder: "b", Keys: []lease.KeyRequest{{Policy: "tenant-a", Key: "k", Want: 80}}})
	require.NoError(t, err)
	assert.InDelta(t, 20, b.Keys[0].Rate, 0.01, "b gets what a leaves until a renews")
	assert.Positive(t, a.RefreshMS)

	m := f.get(t, "/metrics").raw
	assert.Contains(t, m, "sluice_lease_renewals_total 2")
	assert.Contains(t, m, "sluice_lease_leases 2")

	// A whole request refused: its code, which the transport maps back.
	_, err = tr.Renew(ctx, &lease.Request{Keys: []lease.KeyRequest{{Policy: "tenant-a", Key: "k"}}})
	assert.ErrorIs(t, err, lease.ErrBadRequest)
	var many lease.Request
	many.Holder = "c"
	for i := range 1001 {
		many.Keys = append(many.Keys, lease.KeyRequest{Policy: "tenant-a", Key: fmt.Sprint("k", i)})
	}
	_, err = tr.Renew(ctx, &many)
	assert.ErrorIs(t, err, lease.ErrTooManyKeys)
	assert.Contains(t, f.get(t, "/metrics").raw, `sluice_lease_refused_total{code="too_many_keys"} 1`)

	r := f.do(t, http.MethodPost, "/lease", strings.NewReader("{not json"), "application/json")
	assert.Equal(t, http.StatusBadRequest, r.status)
	assert.Equal(t, "bad_request", r.body["code"])
	r = f.do(t, http.MethodGet, "/lease", nil, "")
	assert.Equal(t, http.StatusMethodNotAllowed, r.status)
}

func TestLeaseEndpointOff(t *testing.T) {
	f := leaseFixture(t, false)
	r := f.do(t, http.MethodPost, "/lease", strings.NewReader(`{"holder":"a","keys":[]}`), "application/json")
	assert.Equal(t, http.StatusNotFound, r.status)
	b, _ := json.Marshal(r.body)
	assert.Contains(t, string(b), "leases are off")
}

// Keys up to leasealloc.MaxNameLen bytes are valid, and the server echoes
// each in its grant: the HTTP transport must read the whole answer however
// long the keys (and their JSON escapes) are, not cut it and fail every
// renewal.
func TestLeaseEndpointLongKeys(t *testing.T) {
	f := leaseFixture(t, true)
	tr := lease.HTTP(f.ts.URL, f.ts.Client())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, c := range []struct {
		name string
		unit string
	}{{"plain", "k"}, {"escaped", "<"}} { // json.Marshal writes '<' as \u003c: six bytes
		t.Run(c.name, func(t *testing.T) {
			req := lease.Request{Holder: "long-" + c.name}
			for i := range 100 {
				key := fmt.Sprintf("%03d", i) + strings.Repeat(c.unit, 1024-3)
				req.Keys = append(req.Keys, lease.KeyRequest{Policy: "tenant-a", Key: key, Want: 1})
			}
			resp, err := tr.Renew(ctx, &req)
			require.NoError(t, err)
			require.Len(t, resp.Keys, 100)
			for i, g := range resp.Keys {
				assert.Empty(t, g.Error, "key %d", i)
				assert.Equal(t, req.Keys[i].Key, g.Key)
			}
		})
	}
}

// A request of as many keys as the server takes, each of the most bytes it
// takes, is read whole whatever characters the keys hold: '&', '<' and '>'
// (which json.Marshal writes as six bytes each, \u0026) included, as in a
// key made of a URL's query.
func TestLeaseEndpointFullRequestOfEscapedKeys(t *testing.T) {
	f := leaseFixture(t, true)
	tr := lease.HTTP(f.ts.URL, f.ts.Client())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := lease.Request{Holder: "amp"}
	for i := range 1000 {
		req.Keys = append(req.Keys, lease.KeyRequest{Policy: "tenant-a", Key: fmt.Sprintf("%04d", i) + strings.Repeat("&", 1024-4), Want: 0.01})
	}
	resp, err := tr.Renew(ctx, &req)
	require.NoError(t, err)
	require.Len(t, resp.Keys, 1000)
	assert.Empty(t, resp.Keys[999].Error)
	assert.Equal(t, req.Keys[999].Key, resp.Keys[999].Key)
}

// gate is a request body that signals its first Read (the handler has
// begun reading it) and then blocks until released.
type gate struct {
	started, release chan struct{}
	once             bool
	rest             io.Reader
}

func (g *gate) Read(p []byte) (int, error) {
	if !g.once {
		g.once = true
		close(g.started)
		<-g.release
	}
	return g.rest.Read(p)
}

// The bytes of /lease bodies read at once are bounded server-wide
// (service.DefaultLeaseInFlightBytes, 64 MiB): a body of unknown length
// counts as the largest a request may be (3,328,000 bytes), one of known
// length as that length, and a request past the bound is answered 503 at
// once, before its body is read. Before, every connection could hold
// 3,328,000 bytes being read, however many connections there were.
func TestLeaseBodiesInFlightBounded(t *testing.T) {
	f := leaseFixture(t, true)
	body := `{"holder":"a","keys":[{"policy":"tenant-a","key":"k","want":1}]}`
	chunked := func(r io.Reader) *http.Request {
		req := httptest.NewRequest(http.MethodPost, "/lease", r)
		req.ContentLength = -1 // as large as a request may be
		return req
	}
	const held = 20 // 20 × 3,328,000 bytes: under 64 MiB; 21 are over
	var gates []*gate
	var recs []*httptest.ResponseRecorder
	var wg sync.WaitGroup
	for i := range held {
		g := &gate{started: make(chan struct{}), release: make(chan struct{}),
			rest: strings.NewReader(strings.Replace(body, `"a"`, fmt.Sprintf(`"h%d"`, i), 1))}
		rec := httptest.NewRecorder()
		gates, recs = append(gates, g), append(recs, rec)
		wg.Go(func() { f.srv.ServeHTTP(rec, chunked(g)) })
		<-g.started
	}

	rec := httptest.NewRecorder()
	f.srv.ServeHTTP(rec, chunked(strings.NewReader(body)))
	assert.Equal(t, http.StatusServiceUnavailable, rec.Code, rec.Body.String())
	assert.Contains(t, rec.Body.String(), `"code":"busy"`)
	rec = httptest.NewRecorder()
	f.srv.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/lease", strings.NewReader(body)))
	assert.Equal(t, http.StatusOK, rec.Code, "a body of known length counts as its length: %s", rec.Body.String())

	for _, g := range gates {
		close(g.release)
	}
	wg.Wait()
	for i, r := range recs {
		assert.Equal(t, http.StatusOK, r.Code, "held request %d: %s", i, r.Body.String())
	}
	rec = httptest.NewRecorder()
	f.srv.ServeHTTP(rec, chunked(strings.NewReader(body)))
	assert.Equal(t, http.StatusOK, rec.Code, "the held bodies' bytes were given back: %s", rec.Body.String())
	assert.Contains(t, f.get(t, "/metrics").raw, `sluice_lease_refused_total{code="busy"} 1`)
}
