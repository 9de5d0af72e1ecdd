// Command fetch shows what Sluice is for: a rate-limited HTTP API and a
// client that never sees a 429, because its http.Client's transport is an
// httplimit.Transport: every request waits its turn on a ratelimiter.Limiter
// (and, were a 429 to come back anyway, no request would leave before its
// Retry-After).
//
// It starts a local API server on loopback that allows -rate requests per
// second with bursts of -server-burst and answers 429 Too Many Requests
// above that, then makes -n fetches at once from fibers of a real-time
// sched.Run loop through one client whose transport waits on a limiter of
// the same rate. It prints when each fetch went out and what came back.
//
//	go run ./examples/fetch                  # 50 fetches at 5/s: about 8 s
//	go run ./examples/fetch -rate 50         # the same in under a second
//
// The client's burst (-burst) is kept a little below the server's on
// purpose: the limiter guarantees its own schedule exactly, but each request
// then crosses the network, and a request that happens to travel faster than
// the one before it (the first ones also pay for connection setup) reaches
// the server a little early. A headroom of a token or two absorbs that
// jitter; it is the same advice as for any real API.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/sluice-go/sluice/httplimit"
	"github.com/sluice-go/sluice/ratelimiter"
	"github.com/sluice-go/sluice/sched"
)

// Config is what a run does.
type Config struct {
	Rate        float64 // requests per second, for the server and the client
	ServerBurst int     // the server answers 429 beyond this burst
	ClientBurst int     // the client limiter's burst (≤ ServerBurst)
	Fetches     int     // how many fetches, all started at once
	Unlimited   bool    // skip Acquire, to see what the server does without it
}

// Fetch is one fetch in the timeline.
type Fetch struct {
	ID     int
	SentAt time.Duration // since the limiter was made
	Status int
}

// Report is the outcome of a run.
type Report struct {
	Fetches  []Fetch // in the order they went out
	TooMany  int     // 429 answers
	OK       int     // 200 answers
	Duration time.Duration
}

func main() {
	cfg := Config{}
	flag.Float64Var(&cfg.Rate, "rate", 5, "requests per second the server allows (and the client keeps to)")
	flag.IntVar(&cfg.ServerBurst, "server-burst", 10, "burst the server allows")
	flag.IntVar(&cfg.ClientBurst, "burst", 8, "burst of the client's limiter (keep it under -server-burst)")
	flag.IntVar(&cfg.Fetches, "n", 50, "number of fetches")
	flag.BoolVar(&cfg.Unlimited, "unlimited", false, "fetch without the limiter (expect 429s)")
	flag.Parse()
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fetch:", err)
		os.Exit(1)
	}
	Print(os.Stdout, cfg, rep)
	if rep.TooMany > 0 && !cfg.Unlimited {
		os.Exit(1)
	}
}

// Run starts the API server, makes the fetches and shuts everything down.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Fetches < 1 || cfg.ClientBurst < 1 || cfg.ServerBurst < cfg.ClientBurst {
		return nil, fmt.Errorf("fetch: need n ≥ 1 and 1 ≤ burst ≤ server-burst, got n=%d burst=%d server-burst=%d",
			cfg.Fetches, cfg.ClientBurst, cfg.ServerBurst)
	}
	if !(cfg.Rate > 0 && cfg.Rate <= 1e6) {
		return nil, fmt.Errorf("fetch: rate %v: must be above 0 and at most 1e6", cfg.Rate)
	}
	api := newAPI(cfg.Rate, cfg.ServerBurst)
	srv := httptest.NewServer(api) // 127.0.0.1, a free port
	defer srv.Close()
	base := &http.Transport{MaxIdleConnsPerHost: cfg.Fetches}
	defer base.CloseIdleConnections()

	rep := &Report{}
	var mu sync.Mutex // guards rep: round trips run on goroutines of their own
	err := sched.Run(ctx, func(ctx context.Context) error {
		// The timeline starts just before the limiter does, so that every
		// offset is at least the limiter's own schedule for that fetch.
		start := sched.Now(ctx)
		var limiter httplimit.Limiter = unlimited{}
		if !cfg.Unlimited {
			l, err := ratelimiter.New(ctx, cfg.Rate, cfg.ClientBurst)
			if err != nil {
				return err
			}
			limiter = l
		}
		// The whole of the limiting: this client waits its turn per request.
		client := &http.Client{
			Transport: httplimit.Transport(stamp{base, start, &mu, rep}, limiter),
			Timeout:   30 * time.Second,
		}
		var fibers []*sched.Fiber
		for i := range cfg.Fetches {
			fibers = append(fibers, sched.Go(ctx, func(ctx context.Context) error {
				return get(ctx, client, fmt.Sprintf("%s/item/%d", srv.URL, i))
			}))
		}
		var errs []error
		for _, f := range fibers {
			errs = append(errs, f.Wait(ctx))
		}
		rep.Duration = sched.Now(ctx).Sub(start)
		return errors.Join(errs...)
	})
	sort.Slice(rep.Fetches, func(a, b int) bool { return rep.Fetches[a].SentAt < rep.Fetches[b].SentAt })
	return rep, err
}

// get fetches url from a fiber. The transport parks the fiber while it
// waits its turn and runs the round trip off the loop; the body is read off
// the loop too, so other fibers keep going.
func get(ctx context.Context, c *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	return sched.Blocking(ctx, func() error {
		defer resp.Body.Close()
		_, err := io.Copy(io.Discard, resp.Body)
		return err
	})
}

// stamp is the base transport with a log: it records when each request
// actually went out (after its wait) and what came back.
type stamp struct {
	base  http.RoundTripper
	start time.Time
	mu    *sync.Mutex
	rep   *Report
}

func (s stamp) RoundTrip(req *http.Request) (*http.Response, error) {
	sent := sched.Now(req.Context()).Sub(s.start)
	resp, err := s.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	var id int
	_, _ = fmt.Sscanf(req.URL.Path, "/item/%d", &id)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rep.Fetches = append(s.rep.Fetches, Fetch{ID: id, SentAt: sent, Status: resp.StatusCode})
	switch resp.StatusCode {
	case http.StatusOK:
		s.rep.OK++
	case http.StatusTooManyRequests:
		s.rep.TooMany++
	}
	return resp, nil
}

// unlimited lets every request go at once (the -unlimited control run).
type unlimited struct{}

func (unlimited) Acquire(ctx context.Context, _ int) error { return ctx.Err() }

// Print writes the timeline and the summary.
func Print(w io.Writer, cfg Config, rep *Report) {
	if cfg.Unlimited {
		fmt.Fprintf(w, "server allows %v/s, burst %d; no client limiter; %d fetches\n", cfg.Rate, cfg.ServerBurst, cfg.Fetches)
	} else {
		fmt.Fprintf(w, "server allows %v/s, burst %d; client limiter %v/s, burst %d; %d fetches\n",
			cfg.Rate, cfg.ServerBurst, cfg.Rate, cfg.ClientBurst, cfg.Fetches)
	}
	for _, f := range rep.Fetches {
		fmt.Fprintf(w, "  +%8.3fs  fetch %2d  %d %s\n", f.SentAt.Seconds(), f.ID, f.Status, http.StatusText(f.Status))
	}
	fmt.Fprintf(w, "%d OK, %d too many requests, in %.3fs", rep.OK, rep.TooMany, rep.Duration.Seconds())
	if !cfg.Unlimited {
		fmt.Fprintf(w, " (the limiter's schedule: %d at once, then one every %v)", cfg.ClientBurst, time.Duration(float64(time.Second)/cfg.Rate))
	}
	fmt.Fprintln(w)
}

// api is the rate-limited service: a GCRA bucket of its own (written
// independently of Sluice's limiter, as a real API's would be) that answers
// 429 with Retry-After above its limit.
type api struct {
	interval time.Duration // one request's worth of time
	tau      time.Duration // burst × interval

	mu  sync.Mutex
	tat time.Time // theoretical arrival time; zero: a full bucket
}

func newAPI(rate float64, burst int) *api {
	iv := time.Duration(float64(time.Second) / rate)
	return &api{interval: iv, tau: time.Duration(burst) * iv}
}

func (a *api) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	a.mu.Lock()
	tat := a.tat
	if tat.Before(now) {
		tat = now
	}
	next := tat.Add(a.interval)
	allowed := next.Sub(now) <= a.tau
	if allowed {
		a.tat = next
	}
	a.mu.Unlock()
	if !allowed {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "slow down", http.StatusTooManyRequests)
		return
	}
	fmt.Fprintf(w, "item %s\n", r.URL.Path)
}
