package main_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// pki is a test CA that signs server and client certificates.
type pki struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

var serial int64 = 1

// sign completes tmpl (a fresh key, the next serial number, an hour either
// side of now) and signs it with parentKey as parent; a nil parent makes it
// self-signed. It returns the certificate's DER and its key.
func sign(t *testing.T, tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	serial++
	tmpl.SerialNumber = big.NewInt(serial)
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	require.NoError(t, err)
	return der, key
}

func newCA(t *testing.T, name string) *pki {
	t.Helper()
	der, key := sign(t, &x509.Certificate{
		Subject:               pkix.Name{CommonName: name},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}, nil, nil)
	c, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return &pki{cert: c, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue signs a leaf for name: a server certificate for 127.0.0.1, or a
// client one. It returns the PEM of the certificate and of its key.
func (ca *pki) issue(t *testing.T, name string, client bool) (certPEM, keyPEM []byte, sn int64) {
	t.Helper()
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: name},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	if client {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		tmpl.IPAddresses = nil
		tmpl.DNSNames = []string{name}
	}
	der, key := sign(t, tmpl, ca.cert, ca.key)
	kder, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), serial
}

func (ca *pki) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

func (ca *pki) keyPair(t *testing.T, name string) tls.Certificate {
	t.Helper()
	c, k, _ := ca.issue(t, name, true)
	kp, err := tls.X509KeyPair(c, k)
	require.NoError(t, err)
	return kp
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	// Write aside and rename, as kubelet and careful tools do: a reader
	// never sees half a file.
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, b, 0o600))
	require.NoError(t, os.Rename(tmp, path))
}

// tlsFiles writes a server certificate signed by ca to dir and returns the
// -tls-cert and -tls-key paths and the certificate's serial number.
func tlsFiles(t *testing.T, dir string, ca *pki) (certFile, keyFile string, sn int64) {
	t.Helper()
	c, k, sn := ca.issue(t, "sluice-test-server", false)
	certFile, keyFile = filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	writeFile(t, certFile, c)
	writeFile(t, keyFile, k)
	return certFile, keyFile, sn
}

// httpsClient trusts roots and presents client (if any); each call to it
// makes a client with its own connections.
func httpsClient(roots *x509.CertPool, client *tls.Certificate) *http.Client {
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if client != nil {
		cfg.Certificates = []tls.Certificate{*client}
	}
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
}

// serverSerial makes one request and returns the serial number of the
// certificate the server presented, or the request's error.
func serverSerial(hc *http.Client, url string) (int64, error) {
	r, err := hc.Get(url)
	if err != nil {
		return 0, err
	}
	defer r.Body.Close()
	_, _ = io.Copy(io.Discard, r.Body) // read to the end, so the connection is kept
	return r.TLS.PeerCertificates[0].SerialNumber.Int64(), nil
}

func grpcTLS(t *testing.T, s *server, roots *x509.CertPool, client *tls.Certificate) rlsv3.RateLimitServiceClient {
	t.Helper()
	m := grpcListenRE.FindStringSubmatch(s.logs.String())
	require.NotNil(t, m, "no grpc listening line:\n%s", s.logs.String())
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if client != nil {
		cfg.Certificates = []tls.Certificate{*client}
	}
	conn, err := grpc.NewClient(m[1], grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

func tryRLS(c rlsv3.RateLimitServiceClient) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "tls"}},
	}}})
	return err
}

func TestServeTLS(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, "sluice test CA")
	certFile, keyFile, sn := tlsFiles(t, dir, ca)
	rulesFile := filepath.Join(dir, "ratelimit.yaml")
	writeRules(t, rulesFile, e2eRules)
	s := serve(t, "-store", "memory", "-grpc", "127.0.0.1:0", "-config", rulesFile, "-tls-cert", certFile, "-tls-key", keyFile)
	assert.Contains(t, s.logs.String(), "tls=on")
	url := strings.Replace(s.URL, "http://", "https://", 1)

	got, err := serverSerial(httpsClient(ca.pool(), nil), url+"/allow?key=k")
	require.NoError(t, err)
	assert.Equal(t, sn, got)
	r := get(t, s.URL+"/healthz") // plain HTTP to the TLS port
	assert.Equal(t, http.StatusBadRequest, r.status, "net/http's answer to plain HTTP on a TLS port")

	c := grpcTLS(t, s, ca.pool(), nil)
	r2 := shouldRateLimit(t, c, "api", "user", "ann")
	assert.Equal(t, rlsv3.RateLimitResponse_OK, r2.OverallCode)
	assert.EqualValues(t, 2, r2.Statuses[0].LimitRemaining)

	_, err = serverSerial(httpsClient(newCA(t, "another CA").pool(), nil), url+"/healthz")
	require.Error(t, err, "a client that does not trust the server's CA")
	assert.Equal(t, 0, s.stop(t))
}

func TestServeMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca, clientCA, otherCA := newCA(t, "server CA"), newCA(t, "client CA"), newCA(t, "other client CA")
	certFile, keyFile, _ := tlsFiles(t, dir, ca)
	caFile := filepath.Join(dir, "client-ca.pem")
	writeFile(t, caFile, clientCA.pem)
	rulesFile := filepath.Join(dir, "ratelimit.yaml")
	writeRules(t, rulesFile, e2eRules)
	s := serve(t, "-store", "memory", "-grpc", "127.0.0.1:0", "-config", rulesFile,
		"-tls-cert", certFile, "-tls-key", keyFile, "-client-ca", caFile, "-tls-poll", "0")
	assert.Contains(t, s.logs.String(), "tls=mutual")
	url := strings.Replace(s.URL, "http://", "https://", 1) + "/allow?key=k"
	good, wrong := clientCA.keyPair(t, "replica-1"), otherCA.keyPair(t, "intruder")

	_, err := serverSerial(httpsClient(ca.pool(), &good), url)
	require.NoError(t, err, "a client certificate the client CA signed")
	_, err = serverSerial(httpsClient(ca.pool(), nil), url)
	require.Error(t, err, "no client certificate")
	_, err = serverSerial(httpsClient(ca.pool(), &wrong), url)
	require.Error(t, err, "a client certificate of another CA")

	require.NoError(t, tryRLS(grpcTLS(t, s, ca.pool(), &good)))
	require.Error(t, tryRLS(grpcTLS(t, s, ca.pool(), nil)), "gRPC without a client certificate")
	require.Error(t, tryRLS(grpcTLS(t, s, ca.pool(), &wrong)), "gRPC with a certificate of another CA")

	// A reload that trusts the other CA instead: it takes effect for new
	// handshakes, and a connection open before it stays up.
	kept := httpsClient(ca.pool(), &good)
	_, err = serverSerial(kept, url)
	require.NoError(t, err)
	writeFile(t, caFile, otherCA.pem)
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Contains(s.logs.String(), `msg="tls certificates reloaded"`) },
		10*time.Second, 5*time.Millisecond, "%s", s.logs.String())
	_, err = serverSerial(httpsClient(ca.pool(), &wrong), url)
	require.NoError(t, err, "the newly trusted CA")
	_, err = serverSerial(httpsClient(ca.pool(), &good), url)
	require.Error(t, err, "the CA no longer trusted, on a new connection")
	var reused bool
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused },
	}))
	r, err := kept.Do(req)
	require.NoError(t, err, "a connection made before the reload stays up")
	_ = r.Body.Close()
	assert.True(t, reused, "the request went over the old connection")
	assert.Equal(t, 0, s.stop(t))
}

// The certificate is read again on SIGHUP and when its files change; a bad
// file keeps the one in force.
func TestServeTLSReload(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, "sluice test CA")
	certFile, keyFile, sn1 := tlsFiles(t, dir, ca)
	s := serve(t, "-store", "memory", "-tls-cert", certFile, "-tls-key", keyFile, "-tls-poll", "10ms")
	url := strings.Replace(s.URL, "http://", "https://", 1) + "/healthz"
	fresh := func() (int64, error) { return serverSerial(httpsClient(ca.pool(), nil), url) }
	got, err := fresh()
	require.NoError(t, err)
	require.Equal(t, sn1, got)

	// A change seen by the poll, no signal.
	_, _, sn2 := tlsFiles(t, dir, ca)
	require.Eventually(t, func() bool { return strings.Count(s.logs.String(), `msg="tls certificates reloaded"`) == 1 },
		10*time.Second, 5*time.Millisecond, "%s", s.logs.String())
	got, err = fresh()
	require.NoError(t, err)
	assert.Equal(t, sn2, got, "a new handshake gets the new certificate")

	// A broken file: logged, and the certificate in force stays.
	writeFile(t, certFile, []byte("not a certificate"))
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool {
		return strings.Contains(s.logs.String(), `msg="tls certificates reload failed; keeping the certificates in force"`)
	}, 10*time.Second, 5*time.Millisecond, "%s", s.logs.String())
	got, err = fresh()
	require.NoError(t, err)
	assert.Equal(t, sn2, got)
	assert.Equal(t, 0, s.stop(t))
}

func TestServeTLSBadFilesExit2(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, "sluice test CA")
	certFile, keyFile, _ := tlsFiles(t, dir, ca)
	junk := filepath.Join(dir, "junk.pem")
	writeFile(t, junk, []byte("junk"))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-tls-cert", certFile}, "sluice serve: -tls-cert needs -tls-key"},
		{[]string{"-tls-key", keyFile}, "sluice serve: -tls-key needs -tls-cert"},
		{[]string{"-client-ca", certFile}, "sluice serve: -tls-cert and -tls-key: both are needed"},
		{[]string{"-tls-cert", filepath.Join(dir, "missing.pem"), "-tls-key", keyFile}, "missing.pem: no such file or directory"},
		{[]string{"-tls-cert", junk, "-tls-key", keyFile}, "failed to find any PEM data in certificate input"},
		{[]string{"-tls-cert", certFile, "-tls-key", keyFile, "-client-ca", junk}, "sluice serve: -client-ca " + junk + ": no PEM certificate in the file"},
		{[]string{"-tls-cert", certFile, "-tls-key", keyFile, "-client-ca", filepath.Join(dir, "nope.pem")}, "sluice serve: -client-ca: open"},
		{[]string{"-tls-cert", certFile, "-tls-key", keyFile, "-client-names", "a"}, "sluice serve: -client-names needs -client-ca"},
	} {
		out, err := exec.Command(binary, append([]string{"serve", "-addr", "127.0.0.1:0"}, c.args...)...).CombinedOutput()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "%v: %s", c.args, out)
		assert.Equal(t, 2, ee.ExitCode(), "%v", c.args)
		assert.Contains(t, string(out), c.want, "%v", c.args)
	}
}

// The gRPC health service answers over TLS too (Envoy's health checks).
func TestServeTLSGRPCHealth(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, "sluice test CA")
	certFile, keyFile, _ := tlsFiles(t, dir, ca)
	s := serve(t, "-store", "memory", "-grpc", "127.0.0.1:0", "-tls-cert", certFile, "-tls-key", keyFile)
	m := grpcListenRE.FindStringSubmatch(s.logs.String())
	require.NotNil(t, m)
	assert.Contains(t, s.logs.String(), `msg="grpc listening" addr=`+m[1]+` service=envoy.service.ratelimit.v3.RateLimitService tls=on`)
	conn, err := grpc.NewClient(m[1], grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.pool(), MinVersion: tls.VersionTLS12})))
	require.NoError(t, err)
	defer conn.Close()
	h, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, h.Status)
	assert.Equal(t, 0, s.stop(t))
}

// -client-names: only the named clients may spend; others get 403 (gRPC:
// PermissionDenied) with the reason, counted; /healthz stays open.
func TestServeClientNames(t *testing.T) {
	dir := t.TempDir()
	ca, clientCA := newCA(t, "server CA"), newCA(t, "client CA")
	certFile, keyFile, _ := tlsFiles(t, dir, ca)
	caFile := filepath.Join(dir, "client-ca.pem")
	writeFile(t, caFile, clientCA.pem)
	rulesFile := filepath.Join(dir, "ratelimit.yaml")
	writeRules(t, rulesFile, e2eRules)
	s := serve(t, "-store", "memory", "-grpc", "127.0.0.1:0", "-config", rulesFile,
		"-tls-cert", certFile, "-tls-key", keyFile, "-client-ca", caFile, "-client-names", "replica-1, replica-3")
	base := strings.Replace(s.URL, "http://", "https://", 1)
	one, two := clientCA.keyPair(t, "replica-1"), clientCA.keyPair(t, "replica-2")
	get := func(c *tls.Certificate, path string) (int, string) {
		r, err := httpsClient(ca.pool(), c).Get(base + path)
		require.NoError(t, err)
		defer r.Body.Close()
		b, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		return r.StatusCode, string(b)
	}
	code, _ := get(&one, "/allow?key=k")
	assert.Equal(t, http.StatusOK, code)
	code, body := get(&two, "/allow?key=k")
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, `client certificate names \"replica-2\", none of which -client-names lists`)
	code, _ = get(&two, "/healthz")
	assert.Equal(t, http.StatusOK, code, "health checks stay open")

	require.NoError(t, tryRLS(grpcTLS(t, s, ca.pool(), &one)))
	err := tryRLS(grpcTLS(t, s, ca.pool(), &two))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "PermissionDenied")

	_, m := get(&one, "/metrics")
	assert.Contains(t, m, `sluice_client_refused_total{port="http"} 1`)
	assert.Contains(t, m, `sluice_client_refused_total{port="grpc"} 1`)
	assert.Equal(t, 0, s.stop(t))
}

// -admin-addr takes /stats and /metrics off the decision port.
func TestServeAdminAddr(t *testing.T) {
	s := serve(t, "-store", "memory", "-admin-addr", "127.0.0.1:0")
	m := regexp.MustCompile(`msg="admin listening" addr=(\S+)`).FindStringSubmatch(s.logs.String())
	require.NotNil(t, m, "%s", s.logs.String())
	admin := "http://" + m[1]
	assert.Equal(t, http.StatusOK, get(t, s.URL+"/allow?key=a").status)
	assert.Equal(t, http.StatusOK, get(t, s.URL+"/healthz").status)
	for _, p := range []string{"/metrics", "/stats"} {
		r := get(t, s.URL+p)
		assert.Equal(t, http.StatusNotFound, r.status, p)
		assert.Contains(t, r.body, "are on the admin address", p)
		assert.Equal(t, http.StatusOK, get(t, admin+p).status, p)
	}
	assert.Contains(t, get(t, admin+"/metrics").body, `sluice_decisions_total{policy="default",result="allowed"} 1`)
	assert.Contains(t, get(t, admin+"/stats").body, `"allowed_total":1`)
	assert.Equal(t, http.StatusNotFound, get(t, admin+"/allow?key=a").status, "nothing spends on the admin address")
	assert.Equal(t, 0, s.stop(t))
}
