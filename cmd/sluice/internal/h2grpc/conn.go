package h2grpc

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Ping policy, as grpc-go's keepalive enforcement on `sluice serve -grpc`:
// pings are welcome every pingMinGap, with or without streams; a client
// that pings more often than that more than pingStrikes times in a row,
// with no answer written in between, gets GOAWAY ENHANCE_YOUR_CALM.
// ackDelay is how long a PING's ack waits before it is written (with the
// others held then); maxAcks acks held make them all leave at once.
//
// Why hold acks: grpc-go's client estimates bandwidth by sending a PING
// each time an answer's DATA arrives and no PING of its is unacknowledged,
// which with one call in flight is a PING per call, and an ack written
// alone per call. Held, an ack costs one write per connection every 10 ms
// at most, and the client's next PING waits for it: with 32 connections
// of one call each from grpc-go's client against `serve -store memory`,
// the server spent 16% less CPU per call than with acks written at once
// (41.3 against 49.1 µs, 4 interleaved runs each). Why 10 ms: far below
// any keepalive timeout (grpc-go's 20 s, Envoy's seconds), which is what
// an ack's lateness can cost; RFC 9113 asks that acks go out early, not
// at once.
const ackDelay = 10 * time.Millisecond

const maxAcks = 8

const (
	pingMinGap  = 5 * time.Second
	pingStrikes = 2
)

// conn is one connection the server serves. Its reader (serve) owns the
// framer's reading side and lastID; everything else is guarded by mu.
type conn struct {
	s   *Server
	nc  net.Conn
	ctx context.Context // the peer, for the handlers
	br  *bufio.Reader
	fr  *http2.Framer

	lastID uint32 // the highest stream the client opened
	ready  []work // calls to run on the reader (Config.Inline), in order

	// mu guards the writing side (bw, the framer's writes) and the state
	// below. A call's worker takes it to write its answer; the reader to
	// open, feed and end streams; the janitor to end late ones.
	mu          sync.Mutex
	bw          *bufio.Writer
	windowed    sync.Cond // signalled when a send window opens or the connection ends
	streams     map[uint32]*call
	open        int   // streams counted against MaxStreams
	sendWindow  int64 // the connection's, for our DATA
	peerWindow  int32 // the client's SETTINGS_INITIAL_WINDOW_SIZE
	peerFrame   uint32
	recvUnacked uint32 // connection window consumed and not yet given back
	recvUsed    int64  // connection window consumed of what we granted
	closed      bool
	goingAway   bool
	idleSince   time.Time // when open last fell to 0
	lastPing    time.Time
	strikes     int
	answered    bool // an answer was written since the last ping
	batching    bool // the reader runs calls whose answers it flushes at the end (runReady)
	janitor     *time.Timer
	acks        [][8]byte   // PING acks held back (see ackDelay)
	ackTimer    *time.Timer // sends acks
}

func newConn(s *Server, nc net.Conn, rc *replayConn) *conn {
	c := &conn{s: s, nc: nc, streams: map[uint32]*call{}, peerWindow: 65535, peerFrame: 16384,
		sendWindow: 65535, idleSince: time.Now()}
	c.windowed.L = &c.mu
	rc.pending = rc.pending[len(http2.ClientPreface):] // the sniff checked it
	c.br = bufio.NewReaderSize(rc, 16<<10)
	c.bw = bufio.NewWriterSize(deadlineWriter{nc, s.cfg.RecvTimeout}, 16<<10)
	c.fr = http2.NewFramer(c.bw, c.br)
	c.fr.SetReuseFrames()
	c.fr.SetMaxReadFrameSize(16384) // what we advertise: no client makes us buffer a 16 MiB frame
	c.fr.MaxHeaderListSize = uint32(s.cfg.MaxRequestBytes)
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.ReadMetaHeaders.SetMaxStringLength(s.cfg.MaxRequestBytes)
	p := &peer.Peer{Addr: nc.RemoteAddr(), LocalAddr: nc.LocalAddr()}
	if tc, ok := nc.(*tls.Conn); ok {
		p.AuthInfo = credentials.TLSInfo{State: tc.ConnectionState(),
			CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}
	} else {
		p.AuthInfo = insecureInfo{credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}} // as grpc-go's
	}
	c.ctx = peer.NewContext(context.Background(), p)
	return c
}

// serve runs the connection: it acknowledges what the sniff read, then
// reads frames until the connection ends.
func (c *conn) serve() {
	c.mu.Lock()
	if c.s.cfg.ConnWindow > 65535 {
		_ = c.fr.WriteWindowUpdate(0, c.s.cfg.ConnWindow-65535)
	}
	c.flushLocked()
	c.janitor = time.AfterFunc(c.tick(), c.sweep)
	c.mu.Unlock()
	defer c.dropReady() // after close: deferred calls run last first
	defer c.close()
	for {
		f, err := c.fr.ReadFrame()
		var se http2.StreamError
		if errors.As(err, &se) {
			c.streamError(se)
			continue
		}
		if err != nil {
			c.readFailed(err)
			return
		}
		if !c.frame(f) {
			return
		}
		// Config.Inline's calls run once nothing more is read (or 16 wait),
		// their answers written together: the calls of one read, one write.
		if len(c.ready) > 0 && (c.br.Buffered() == 0 || len(c.ready) >= 16) {
			c.runReady()
		}
	}
}

// runReady runs the calls on the reader (Config.Inline), their answers
// held in the write buffer until the last is written.
func (c *conn) runReady() {
	c.mu.Lock()
	c.batching = len(c.ready) > 1
	c.mu.Unlock()
	for i := range c.ready {
		w := c.ready[i]
		c.ready[i] = work{}
		w.st.run(w.ctx, true)
	}
	c.ready = c.ready[:0]
	c.mu.Lock()
	if c.batching {
		c.batching = false
		c.flushLocked()
	}
	c.mu.Unlock()
}

// dropReady ends the calls left to run when the connection ended, giving
// back their places (Config.Release).
func (c *conn) dropReady() {
	for _, w := range c.ready {
		putBuf(w.st.body)
		w.st.body = nil
		w.st.answer(nil, context.Canceled)
	}
	c.ready = nil
}

// tick is how often the janitor looks for late streams and idleness.
func (c *conn) tick() time.Duration {
	return max(min(c.s.cfg.RecvTimeout, c.s.cfg.IdleTimeout)/4, time.Millisecond)
}

// streamError resets the stream of a frame the framer refused (a bad
// header field, a zero window increment); the connection goes on.
func (c *conn) streamError(se http2.StreamError) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st := c.streams[se.StreamID]; st != nil {
		c.rstLocked(st, se.Code)
		return
	}
	if se.StreamID > c.lastID {
		c.lastID = se.StreamID
	}
	_ = c.fr.WriteRSTStream(se.StreamID, se.Code)
	c.flushLocked()
}

// readFailed ends the connection after a read error, with GOAWAY when the
// client broke the protocol.
func (c *conn) readFailed(err error) {
	var ce http2.ConnectionError
	switch {
	case errors.As(err, &ce):
		c.fail(http2.ErrCode(ce), "")
	case errors.Is(err, http2.ErrFrameTooLarge):
		c.fail(http2.ErrCodeFrameSize, "")
	}
}

// frame handles one frame; it reports false when the connection must end.
func (c *conn) frame(f http2.Frame) bool {
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		return c.headers(f)
	case *http2.DataFrame:
		return c.data(f)
	case *http2.RSTStreamFrame:
		c.mu.Lock()
		if st := c.streams[f.StreamID]; st != nil {
			st.resetLocked()
		}
		c.mu.Unlock()
	case *http2.SettingsFrame:
		return c.settings(f)
	case *http2.PingFrame:
		return c.ping(f)
	case *http2.WindowUpdateFrame:
		return c.windowUpdate(f)
	case *http2.GoAwayFrame:
		// The client opens no more streams; those open are answered.
	case *http2.PushPromiseFrame:
		c.fail(http2.ErrCodeProtocol, "push from a client")
		return false
	}
	return true
}

func (c *conn) settings(f *http2.SettingsFrame) bool {
	if f.IsAck() {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	err := f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			return err
		}
		switch s.ID {
		case http2.SettingInitialWindowSize:
			// RFC 9113 6.9.2: open streams' windows move by the change.
			d := int64(s.Val) - int64(c.peerWindow)
			for _, st := range c.streams {
				st.sendWindow += d
			}
			c.peerWindow = int32(s.Val)
		case http2.SettingMaxFrameSize:
			c.peerFrame = s.Val
		}
		return nil
	})
	if err != nil {
		c.failLocked(http2.ErrCodeProtocol, "bad setting")
		return false
	}
	_ = c.fr.WriteSettingsAck()
	c.flushLocked()
	c.windowed.Broadcast()
	return true
}

func (c *conn) ping(f *http2.PingFrame) bool {
	if f.IsAck() {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	switch {
	case c.answered:
		c.strikes = 0
	case now.Sub(c.lastPing) < pingMinGap:
		if c.strikes++; c.strikes > pingStrikes {
			c.failLocked(http2.ErrCodeEnhanceYourCalm, "too_many_pings")
			return false
		}
	}
	c.lastPing, c.answered = now, false
	if len(c.acks) == maxAcks {
		c.writeAcksLocked()
		_ = c.fr.WritePing(true, f.Data)
		c.flushLocked()
		return true
	}
	c.acks = append(c.acks, f.Data)
	if len(c.acks) == 1 {
		if c.ackTimer == nil {
			c.ackTimer = time.AfterFunc(ackDelay, c.sendAcks)
		} else {
			c.ackTimer.Reset(ackDelay)
		}
	}
	return true
}

// writeAcksLocked writes the pending PING acks.
func (c *conn) writeAcksLocked() {
	for _, d := range c.acks {
		_ = c.fr.WritePing(true, d)
	}
	c.acks = c.acks[:0]
}

func (c *conn) sendAcks() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.acks) > 0 && !c.closed {
		c.writeAcksLocked()
		c.flushLocked()
	}
}

func (c *conn) windowUpdate(f *http2.WindowUpdateFrame) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f.StreamID == 0 {
		if c.sendWindow += int64(f.Increment); c.sendWindow > 1<<31-1 {
			c.failLocked(http2.ErrCodeFlowControl, "window overflow")
			return false
		}
	} else if st := c.streams[f.StreamID]; st != nil {
		if st.sendWindow += int64(f.Increment); st.sendWindow > 1<<31-1 {
			c.rstLocked(st, http2.ErrCodeFlowControl)
		}
	}
	c.windowed.Broadcast()
	return true
}

// consume counts n bytes of DATA against the connection's receive window
// and gives them back in batches; it reports false when the client sent
// more than the window allowed.
func (c *conn) consumeLocked(n uint32) bool {
	if c.recvUsed += int64(n); c.recvUsed > int64(c.s.cfg.ConnWindow) {
		c.failLocked(http2.ErrCodeFlowControl, "connection window exceeded")
		return false
	}
	if c.recvUnacked += n; c.recvUnacked >= c.s.cfg.ConnWindow/4 {
		_ = c.fr.WriteWindowUpdate(0, c.recvUnacked)
		c.flushLocked() // now: no answer may come for a while to carry it
		c.recvUsed -= int64(c.recvUnacked)
		c.recvUnacked = 0
	}
	return true
}

// deadlineWriter bounds each write to the connection by d: a client that
// does not read holds mu no longer than that, whoever writes (a worker, the
// reader, the janitor, or bufio by itself mid-answer), and its connection
// is then closed.
type deadlineWriter struct {
	nc net.Conn
	d  time.Duration
}

func (w deadlineWriter) Write(p []byte) (int, error) {
	if err := w.nc.SetWriteDeadline(time.Now().Add(w.d)); err != nil {
		return 0, err
	}
	return w.nc.Write(p)
}

// flushLocked writes what is buffered; a write that fails (past its
// deadline) closes the connection.
func (c *conn) flushLocked() {
	if c.bw.Buffered() == 0 || c.closed || c.batching {
		return
	}
	if err := c.bw.Flush(); err != nil {
		c.closeLocked()
	}
}

// fail sends GOAWAY with code and closes the connection.
func (c *conn) fail(code http2.ErrCode, debug string) {
	c.mu.Lock()
	c.failLocked(code, debug)
	c.mu.Unlock()
}

func (c *conn) failLocked(code http2.ErrCode, debug string) {
	if c.closed {
		return
	}
	_ = c.fr.WriteGoAway(c.lastID, code, []byte(debug))
	c.flushLocked()
	c.closeLocked()
}

// goAway begins a graceful end: no stream past the last one opened is
// served, and the connection closes once every open one is answered.
func (c *conn) goAway() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.goingAway || c.closed {
		return
	}
	c.goingAway = true
	_ = c.fr.WriteGoAway(c.lastID, http2.ErrCodeNo, nil)
	c.flushLocked()
	if c.open == 0 {
		c.closeLocked()
	}
}

func (c *conn) close() {
	c.mu.Lock()
	c.closeLocked()
	c.mu.Unlock()
}

// closeLocked closes the connection and cancels its calls in flight.
func (c *conn) closeLocked() {
	if c.closed {
		return
	}
	if c.batching {
		// Answers of a batch (and a GOAWAY) are held: a graceful end
		// (the batch's last call answered after goAway) sends them first.
		// After a failed write this fails at once: bufio keeps the error.
		c.batching = false
		_ = c.bw.Flush()
	}
	c.closed = true
	c.nc.Close()
	if c.janitor != nil {
		c.janitor.Stop()
	}
	if c.ackTimer != nil {
		c.ackTimer.Stop()
	}
	for _, st := range c.streams {
		st.resetLocked()
	}
	c.windowed.Broadcast()
}

// sweep is the janitor: it answers streams whose request is late, closes a
// connection idle for IdleTimeout, and
// wakes answers waiting for a window so that they see their deadlines.
func (c *conn) sweep() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	now := time.Now()
	for _, st := range c.streams {
		if st.state == receiving && now.After(st.deadline) {
			c.answerLocked(st, codeDeadlineExceeded, "sluice: the request did not arrive in time")
			c.endLocked(st)
		}
	}
	if c.open == 0 && now.Sub(c.idleSince) >= c.s.cfg.IdleTimeout {
		_ = c.fr.WriteGoAway(c.lastID, http2.ErrCodeNo, []byte("max_idle"))
		c.flushLocked()
		c.closeLocked()
		return
	}
	c.windowed.Broadcast()
	c.janitor.Reset(c.tick())
}
