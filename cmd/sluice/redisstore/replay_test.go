package redisstore_test

import (
	"context"
	"io"
	"math"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/redisstore"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/store"
)

// stallProxy forwards TCP to Redis; while stalled it holds back Redis's
// replies, so a call times out after Redis has already run it.
type stallProxy struct {
	ln      net.Listener
	target  string
	mu      sync.Mutex
	stalled bool
	resume  chan struct{}
	held    chan struct{} // receives (if empty) when a reply is held back
	wg      sync.WaitGroup
	conns   []net.Conn
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &stallProxy{ln: ln, target: target, resume: make(chan struct{}), held: make(chan struct{}, 1)}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			p.wg.Go(func() { _, _ = io.Copy(s, c); _ = s.Close() })
			p.wg.Go(func() {
				buf := make([]byte, 4096)
				for {
					n, err := s.Read(buf)
					if n > 0 {
						p.mu.Lock()
						stalled, resume := p.stalled, p.resume
						p.mu.Unlock()
						if stalled {
							select {
							case p.held <- struct{}{}:
							default:
							}
							<-resume
						}
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						_ = c.Close()
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		p.setStalled(false)
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *stallProxy) setStalled(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stalled && !on {
		close(p.resume)
		p.resume = make(chan struct{})
	}
	p.stalled = on
}

// A decision whose reply times out is not replayed: Redis charged it once,
// and the store reports an error rather than charging again.
func TestRedisNoReplayAfterTimeout(t *testing.T) {
	srv := redistest.Start(t)
	proxy := newStallProxy(t, srv.Addr())
	viaProxy := open(t, "redis://"+proxy.ln.Addr().String()+"/0")
	direct := open(t, srv.URL())
	ctx := context.Background()
	p := store.Policy{Rate: 1.0 / 3600, Burst: 10}

	_, err := viaProxy.Allow(ctx, "once", 1, p) // loads the script, warms the connection
	require.NoError(t, err)
	proxy.setStalled(true)
	// No ctx deadline: the client's own read timeout fires, the case where
	// go-redis would retry (and so replay) unless retries are off.
	start := time.Now()
	_, err = viaProxy.Allow(ctx, "once", 1, p)
	require.Error(t, err, "the reply was held back past the read timeout")
	assert.Less(t, time.Since(start), 2*redisstore.DefaultTimeout, "one attempt, not several")
	proxy.setStalled(false)

	// Two charges so far if Redis ran the timed-out call (its reply held
	// back), one if the call never reached Redis (rueidis may redial a
	// connection meanwhile, and the new connection's handshake is held back
	// too: 5 runs in 20 here); a replay would make three. Ask with
	// cost 8: allowed, with 0 or 1 token left, whenever nothing was charged
	// twice.
	r, err := direct.Allow(ctx, "once", 8, p)
	require.NoError(t, err)
	assert.True(t, r.Allowed, "at most 2 of 10 tokens were spent: nothing replayed")
	if math.Abs(r.Remaining) > 0.01 {
		assert.InDelta(t, 1, r.Remaining, 0.01, "2 tokens spent (0 left) or 1 (1 left), nothing else")
	}
	t.Logf("tokens left after the cost-8 call: %.2f (0: the timed-out call ran in Redis; 1: it never reached it)", r.Remaining)
}
