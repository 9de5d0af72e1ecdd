package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/sluice-go/sluice/cmd/sluice/internal/h2grpc"
	"github.com/sluice-go/sluice/cmd/sluice/leasegrpc"
	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/cmd/sluice/service/rules"
	"github.com/sluice-go/sluice/store"
)

// streamWorkersPerP sizes WithGRPC's stream workers (grpc.NumStreamWorkers).
// Why workers: without them grpc-go runs each call on a new goroutine, whose
// stack grows (copied) down the handler chain on every call; a worker keeps
// its grown stack. Why this many: a call runs on a worker only if one is
// idle when the call arrives, else on a new goroutine, so it takes a worker
// per call in flight (and the calls whose answers are still being written),
// not per core. With one per P, 16 calls in flight on 2 cores ran mostly on
// new goroutines, their stack growth 14% of the server's CPU; 32 per P cut
// the server's CPU per decision by 16% and raised decisions/s by 24%
// (memory store, TestMeasureGRPCAB, 8 passes; Redis: within the noise).
// An idle worker costs only its stack.
const streamWorkersPerP = 32

// ServeExtra is an optional part of RunServer, started once the service is
// built and before it reports listening; stop is called at shutdown.
type ServeExtra func(ctx context.Context, srv *service.Server, log *slog.Logger) (stop func(), err error)

// WithGRPC serves Envoy's RateLimitService (v3) on addr next to the HTTP API,
// with the standard gRPC health service (SERVING until shutdown begins) for
// Envoy's gRPC health checks. ready, if non-nil, is called with the bound
// address.
func WithGRPC(addr string, ready func(net.Addr)) ServeExtra {
	return WithGRPCLimits(addr, GRPCLimits{}, ready)
}

// WithGRPCLimits is WithGRPC with the bounds lim (see GRPCLimits; WithGRPC
// takes the defaults).
func WithGRPCLimits(addr string, lim GRPCLimits, ready func(net.Addr)) ServeExtra {
	return func(ctx context.Context, srv *service.Server, log *slog.Logger) (func(), error) {
		b, err := newGRPCBounds(lim)
		if err != nil {
			return nil, err
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("-grpc: %w", err)
		}
		certs := certsFrom(ctx)
		var tlsConfig *tls.Config
		creds := insecure.NewCredentials()
		if certs != nil {
			tlsConfig = certs.Config("h2")
			creds = credentials.NewTLS(tlsConfig)
		}
		var (
			fast    *h2grpc.Server
			handoff *h2grpc.Listener
			reg     grpc.ServiceRegistrar
		)
		if b.lim.Transport != "grpc-go" {
			handoff = h2grpc.NewListener(ln.Addr())
			if certs != nil {
				creds = h2grpc.Creds() // the handshake is done before the hand-over
			}
			fast = h2grpc.New(h2grpc.Config{
				MaxStreams: b.lim.MaxStreams, RecvTimeout: b.lim.RecvTimeout, MaxRequestBytes: b.lim.MaxRequestBytes,
				IdleTimeout: b.lim.IdleTimeout, StreamWindow: grpcStreamWindow, ConnWindow: grpcConnWindow,
				Admit: b.budget.admitCounted, Release: b.budget.releaseCounted, Handoff: handoff.Put, Log: log,
				Inline: srv.DecidesInProcess(), InlineAlone: true,
			}, streamWorkersPerP*runtime.GOMAXPROCS(0))
		}
		g := grpc.NewServer(append(append(b.options(), grpcFlowControl()...),
			grpc.Creds(creds),
			grpc.StreamInterceptor(streamInterceptor),
			grpc.NumStreamWorkers(uint32(streamWorkersPerP*runtime.GOMAXPROCS(0))),
		)...)
		reg = g
		if fast != nil {
			reg = registrars{g, fast}
		}
		srv.RegisterRateLimitService(reg)
		leasegrpc.Register(reg, srv.RenewLease) // sluice.lease.v1.Leases, beside Envoy's
		hs := health.NewServer()
		healthpb.RegisterHealthServer(reg, hs)
		// Reflection, so that grpcurl and ghz need no proto files. Its one
		// method streams: a connection that starts with it goes to grpc-go.
		reflection.Register(g)
		b.learn(g)
		log.Info("grpc listening", "addr", ln.Addr().String(), "service", "envoy.service.ratelimit.v3.RateLimitService",
			"tls", tlsMode(certs), "transport", transportName(b.lim.Transport, fast))
		if ready != nil {
			ready(ln.Addr())
		}
		var wg sync.WaitGroup
		if fast == nil {
			wg.Go(func() {
				if err := g.Serve(ln); err != nil {
					log.Error("grpc serve failed", "err", err)
				}
			})
		} else {
			wg.Go(func() {
				if err := g.Serve(handoff); err != nil {
					log.Error("grpc serve failed", "err", err)
				}
			})
			wg.Go(func() {
				if err := fast.Serve(ln, tlsConfig); err != nil && !errors.Is(err, h2grpc.ErrServerClosed) {
					log.Error("grpc serve failed", "err", err)
				}
			})
		}
		return func() {
			// Let calls in flight finish, as the HTTP side does, but not
			// forever: a stuck stream must not hold the process.
			hs.Shutdown()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			stopped := make(chan struct{})
			go func() { g.GracefulStop(); close(stopped) }()
			if fast != nil {
				if fast.Shutdown(ctx) != nil {
					fast.Close()
				}
			}
			select {
			case <-stopped:
			case <-ctx.Done():
				g.Stop()
				<-stopped
			}
			wg.Wait()
		}, nil
	}
}

// transportName is the transport the log line names: grpc-go, or sluice
// with where its calls run (inline: on the connection's reader, since the
// store never waits; otherwise only a call alone on its connection).
func transportName(t string, fast *h2grpc.Server) string {
	switch {
	case fast == nil:
		return t
	case fast.Inline():
		return "sluice (calls inline)"
	}
	return "sluice (a call alone on its connection inline, others on workers)"
}

// registrars registers a service with each of its registrars.
type registrars []grpc.ServiceRegistrar

func (rs registrars) RegisterService(sd *grpc.ServiceDesc, impl any) {
	for _, r := range rs {
		r.RegisterService(sd, impl)
	}
}

// WithRulesReload reloads the rules at paths (files and directories, as
// -config) each time sig delivers (the serve command sends SIGHUP there)
// and, if poll > 0, whenever a check every poll finds a file added or
// removed, or one's size or modification time changed, and then the same on
// the next check (Windows has no SIGHUP; a Kubernetes ConfigMap update swaps
// the files). Every file is read again on each reload, and a bad one keeps
// all the rules in force; service.Server.ReloadRulesContext logs and counts
// either outcome, and bounds a reload's time. stop cancels a reload in
// progress rather than waiting for it.
func WithRulesReload(paths []string, sig <-chan os.Signal, poll time.Duration) ServeExtra {
	return func(ctx context.Context, srv *service.Server, _ *slog.Logger) (func(), error) {
		ctx, cancel := context.WithCancel(ctx)
		var tick <-chan time.Time
		stopTicker := func() {}
		if poll > 0 {
			t := time.NewTicker(poll)
			tick, stopTicker = t.C, t.Stop
		}
		last := rulesStamp(paths)
		var wg sync.WaitGroup
		wg.Go(func() { reloadLoop(ctx, srv, paths, sig, tick, last) })
		return func() { cancel(); wg.Wait(); stopTicker() }, nil
	}
}

func reloadLoop(ctx context.Context, srv *service.Server, paths []string, sig <-chan os.Signal, tick <-chan time.Time, last string) {
	pending := last
	for {
		select {
		case <-ctx.Done():
			return
		case <-sig:
			last = rulesStamp(paths)
			pending = last
			reload(ctx, srv, paths)
		case <-tick:
			// Why sizes and mtimes, not hashes: a stat per file and poll
			// costs little, and an editor or kubelet that rewrites a file
			// changes one. Why wait for two equal readings: a file written
			// in place is briefly truncated or half written, and a
			// directory is filled a file at a time; reloading then would
			// log and count an error for nothing.
			now := rulesStamp(paths)
			if now != last && now == pending {
				last = now
				reload(ctx, srv, paths)
			}
			pending = now
		}
	}
}

// reload reloads the rules and hands the memory the old rules and the
// load's garbage held back to the system. Why: serve runs with GOGC=400
// (see Serve), so after a reload of a large file the heap would keep up to
// four times the rules' size as garbage until the next collections, which
// a quiet server may not run for a long time; a reload is rare, and one
// forced collection of a heap of rules costs milliseconds.
func reload(ctx context.Context, srv *service.Server, paths []string) {
	_ = srv.ReloadRulesContext(ctx, paths...)
	debug.FreeOSMemory()
}

// rulesStamp identifies a version of the rules at paths: the files they
// stand for, with each one's size and modification time. A path that
// cannot be read stamps as its error, so its coming back is a change.
func rulesStamp(paths []string) string {
	files, err := rules.Expand(paths)
	if err != nil {
		return "error: " + err.Error()
	}
	var b strings.Builder
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			fmt.Fprintf(&b, "%s: missing\n", f)
			continue
		}
		fmt.Fprintf(&b, "%s %d %d\n", f, fi.Size(), fi.ModTime().UnixNano())
	}
	return b.String()
}

// loadRules reads the -config files and directories; its errors name the
// file, line and field.
func loadRules(paths []string, opt rules.Options) (*rules.Config, error) {
	c, err := rules.LoadAll(paths, opt)
	if err != nil {
		return nil, fmt.Errorf("-config: %w", err)
	}
	return c, nil
}

// rulePolicies are the store policies of the rules' limited rules.
func rulePolicies(c *rules.Config) []store.Policy {
	var ps []store.Policy
	if c == nil {
		return nil
	}
	for _, r := range c.Rules {
		if p, ok := r.Policy(); ok {
			ps = append(ps, p)
		}
	}
	return ps
}
