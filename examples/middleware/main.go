// Command middleware shows httplimit.Middleware: an HTTP API limited per
// client IP over any store, answering 429 with the IETF RateLimit fields,
// Retry-After and the same JSON body as `sluice serve`.
//
// By default it starts the API on loopback, sends -n requests one after
// another from this process (one IP), prints each answer and exits:
//
//	go run ./examples/middleware                          # in-process memory store
//	go run ./examples/middleware -store shm               # host-wide (Linux)
//	go run ./examples/middleware -store redis://127.0.0.1:6379/0
//	go run ./examples/middleware -store http://127.0.0.1:8100   # a running `sluice serve -rate 2 -burst 5`
//
// The service decides with its own policy, so it must be the example's
// (-rate and -burst, 2 and 5 by default): client.Store answers any other
// with an error wrapping client.ErrPolicyMismatch, and the requests follow
// the fail mode.
//
// With -addr it serves the API there until interrupted instead:
//
//	go run ./examples/middleware -addr 127.0.0.1:8080 &
//	curl -i http://127.0.0.1:8080/
//
// Behind a proxy, -trust names it and the key is the client it saw, read
// from the X-Forwarded-For it appends (-proxy-header Forwarded for a proxy
// that writes RFC 7239 Forwarded instead):
//
//	go run ./examples/middleware -addr 127.0.0.1:8080 -trust 127.0.0.1 &
//	curl -i -H 'X-Forwarded-For: 203.0.113.9' http://127.0.0.1:8080/
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/sluice-go/sluice/client"
	"github.com/sluice-go/sluice/cmd/sluice/redisstore"
	"github.com/sluice-go/sluice/httplimit"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/shmstore"
)

// Config is what a run does.
type Config struct {
	Store    string  // memory, shm, shm:DIR, redis://…, or http://… (a sluice service)
	Rate     float64 // requests per second per IP
	Burst    int64
	Requests int // how many requests the demo sends
	// StoreTimeout bounds each call to a store that does I/O (Redis, the
	// service); past it the request follows the fail mode (open).
	StoreTimeout time.Duration
	Trust        []string // proxies whose ProxyHeader entries are believed (httplimit.KeyByIP)
	ProxyHeader  string   // the header they append to: X-Forwarded-For (default) or Forwarded
}

func main() {
	var cfg Config
	addr := flag.String("addr", "", "serve the API on this address until interrupted (default: run the demo and exit)")
	flag.StringVar(&cfg.Store, "store", "memory", "memory, shm, shm:DIR, redis://HOST:PORT/DB, or http://HOST:PORT of a sluice service")
	flag.Float64Var(&cfg.Rate, "rate", 2, "requests per second per client IP")
	flag.Int64Var(&cfg.Burst, "burst", 5, "burst per client IP")
	flag.IntVar(&cfg.Requests, "n", 8, "requests the demo sends")
	flag.DurationVar(&cfg.StoreTimeout, "store-timeout", httplimit.DefaultStoreTimeout, "bound on each Redis or service call")
	trust := flag.String("trust", "", "comma-separated proxies (IPs or CIDR prefixes) whose forwarding header is believed")
	flag.StringVar(&cfg.ProxyHeader, "proxy-header", "X-Forwarded-For", "the header the trusted proxies append to: X-Forwarded-For or Forwarded")
	flag.Parse()
	if *trust != "" {
		cfg.Trust = strings.Split(*trust, ",")
	}
	if err := run(cfg, *addr, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

func run(cfg Config, addr string, out io.Writer) error {
	st, err := openStore(cfg.Store, cfg.StoreTimeout)
	if err != nil {
		return err
	}
	defer st.Close()
	opts := []httplimit.MiddlewareOption{httplimit.StoreTimeout(cfg.StoreTimeout), httplimit.KeyByIP(cfg.Trust...)}
	if cfg.ProxyHeader != "" {
		opts = append(opts, httplimit.ProxyHeader(cfg.ProxyHeader))
	}
	limit, err := httplimit.NewMiddleware(st, store.Policy{Name: "per-ip", Rate: cfg.Rate, Burst: cfg.Burst}, opts...)
	if err != nil {
		return err
	}
	api := limit.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello from the API")
	}))
	if addr != "" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
		defer stop()
		srv := &http.Server{Addr: addr, Handler: api}
		go func() { <-ctx.Done(); _ = srv.Close() }()
		fmt.Fprintf(out, "serving on http://%s, %v/s burst %d per IP over %s\n", addr, cfg.Rate, cfg.Burst, st.Name())
		if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
	return demo(api, cfg, st.Name(), out)
}

func demo(api http.Handler, cfg Config, storeName string, out io.Writer) error {
	srv := httptest.NewServer(api)
	defer srv.Close()
	defer http.DefaultClient.CloseIdleConnections()
	fmt.Fprintf(out, "API limited to %v/s, burst %d, per IP, over the %s store\n", cfg.Rate, cfg.Burst, storeName)
	for i := 1; i <= cfg.Requests; i++ {
		resp, err := http.Get(srv.URL)
		if err != nil {
			return err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		line := fmt.Sprintf("%2d  %d  RateLimit: %s", i, resp.StatusCode, resp.Header.Get("RateLimit"))
		if ra := resp.Header.Get("Retry-After"); ra != "" {
			line += "  Retry-After: " + ra
		}
		if i == 1 {
			line += "  RateLimit-Policy: " + resp.Header.Get("RateLimit-Policy")
		}
		if resp.StatusCode == http.StatusTooManyRequests {
			// The body's remaining and retry_after_ms move with real time;
			// show its first field.
			b, _, _ := strings.Cut(string(body), `,"remaining"`)
			line += "  " + b + ",…}"
		}
		fmt.Fprintln(out, line)
	}
	return nil
}

// openStore opens what -store names: the service's store kinds, or a
// running sluice service seen as a store through its client.
func openStore(spec string, timeout time.Duration) (store.Store, error) {
	if strings.HasPrefix(spec, "http://") || strings.HasPrefix(spec, "https://") {
		c, err := client.New(spec, client.WithTimeout(timeout))
		if err != nil {
			return nil, err
		}
		return c.Store(), nil
	}
	switch {
	case spec == "memory":
		return store.NewMemory(), nil
	case spec == "shm" || strings.HasPrefix(spec, "shm:") && len(spec) > 4:
		return shmstore.Open(strings.TrimPrefix(strings.TrimPrefix(spec, "shm"), ":"))
	case strings.HasPrefix(spec, "redis://") || strings.HasPrefix(spec, "rediss://"):
		return redisstore.Open(spec, redisstore.WithTimeout(timeout))
	}
	return nil, fmt.Errorf("-store %q: want memory, shm, shm:DIR, redis://HOST:PORT/DB or http://HOST:PORT", spec)
}
