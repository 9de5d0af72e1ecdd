package service

import (
	"context"
	"crypto/x509"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// clientNames decides who may spend: with Config.ClientNames set, a caller
// of /allow or ShouldRateLimit must have presented a verified client
// certificate (mutual TLS) that names one of them. A nil *clientNames lets
// everyone through.
type clientNames struct {
	names   []string
	refused *prometheus.CounterVec // port
}

func newClientNames(names []string, reg prometheus.Registerer) *clientNames {
	if len(names) == 0 {
		return nil
	}
	c := &clientNames{
		names: slices.Clone(names),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_client_refused_total",
			Help: "Decision requests refused because the client certificate names no identity of -client-names (or there was none), by port (http, grpc).",
		}, []string{"port"}),
	}
	reg.MustRegister(c.refused)
	return c
}

// identities are what a certificate can be named by: its DNS, URI and email
// SANs, and its subject's common name.
func identities(cert *x509.Certificate) []string {
	ids := slices.Clone(cert.DNSNames)
	for _, u := range cert.URIs {
		ids = append(ids, u.String())
	}
	ids = append(ids, cert.EmailAddresses...)
	if cn := cert.Subject.CommonName; cn != "" && !slices.Contains(ids, cn) {
		ids = append(ids, cn)
	}
	return ids
}

// check returns nil when chains (the verified chains of a TLS connection)
// start with a certificate that carries one of the names, else the reason
// for the refusal.
func (c *clientNames) check(chains [][]*x509.Certificate) error {
	if len(chains) == 0 || len(chains[0]) == 0 {
		return fmt.Errorf("no verified client certificate: this service answers only the clients -client-names lists")
	}
	ids := identities(chains[0][0])
	for _, id := range ids {
		if slices.Contains(c.names, id) {
			return nil
		}
	}
	return fmt.Errorf("client certificate names %s, none of which -client-names lists", strings.Join(quoteAll(ids), ", "))
}

func quoteAll(ss []string) []string {
	if len(ss) == 0 {
		return []string{"nothing"}
	}
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%q", s)
	}
	return out
}

// allowHTTP answers 403 and returns false when r's client may not spend.
func (s *Server) allowHTTP(w http.ResponseWriter, r *http.Request) bool {
	var chains [][]*x509.Certificate
	if r.TLS != nil {
		chains = r.TLS.VerifiedChains
	}
	err := s.clients.check(chains)
	if err == nil {
		return true
	}
	s.clients.refused.WithLabelValues("http").Inc()
	s.fail(w, http.StatusForbidden, "%v", err)
	return false
}

// allowGRPC returns PermissionDenied when the gRPC peer of ctx may not
// spend.
func (s *Server) allowGRPC(ctx context.Context) error {
	var chains [][]*x509.Certificate
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			chains = ti.State.VerifiedChains
		}
	}
	err := s.clients.check(chains)
	if err == nil {
		return nil
	}
	s.clients.refused.WithLabelValues("grpc").Inc()
	return status.Error(codes.PermissionDenied, err.Error())
}
