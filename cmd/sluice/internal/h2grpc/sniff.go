package h2grpc

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// sniffLimit caps the bytes read from a connection before its first call's
// headers are known: a preface, the client's SETTINGS and WINDOW_UPDATE and
// a header block of up to 16 KiB fit many times over. Past it the
// connection is handed over, so a client can make the server hold no more.
const sniffLimit = 64 << 10

// sniff sends the server's SETTINGS, then reads the client's preface and
// frames up to its first HEADERS (and their CONTINUATIONs), answering none:
// whichever server goes on answers them from the replay. It returns the
// connection with what was read put back in front (nil: close it) and
// whether its first call is a unary method of s.
//
// Why the server's SETTINGS first: a grpc-go client waits for them before
// it sends a call. Why nothing else: the client's SETTINGS must be
// acknowledged once, by the server that keeps the connection. grpc-go
// sends its own SETTINGS when it takes over; a second SETTINGS is allowed,
// and s sends the same values grpc-go does, so the second changes nothing.
//
// A frame other than SETTINGS, WINDOW_UPDATE or PRIORITY before the first
// call (a PING) hands the connection over at once, since it needs an
// answer. A connection that sends no call within IdleTimeout is closed, as
// an idle one would be.
func (s *Server) sniff(nc net.Conn) (*replayConn, bool) {
	if _, err := nc.Write(s.settings); err != nil {
		return nil, false
	}
	rec := &recorder{r: nc}
	_ = nc.SetReadDeadline(time.Now().Add(s.cfg.IdleTimeout))
	fast, ok := s.firstCall(rec)
	if err := nc.SetReadDeadline(time.Time{}); err != nil || !ok {
		return nil, false
	}
	return &replayConn{Conn: nc, pending: rec.buf.Bytes()}, fast
}

// firstCall reads up to the first call's header block and reports whether
// it names a unary method of s; ok false means the connection should be
// closed (it failed, or sent no call in time).
func (s *Server) firstCall(r io.Reader) (fast, ok bool) {
	var preface [len(http2.ClientPreface)]byte
	if _, err := io.ReadFull(r, preface[:]); err != nil {
		return false, false
	}
	if string(preface[:]) != http2.ClientPreface {
		return false, true // grpc-go answers a bad preface as it does
	}
	var (
		hdr    [9]byte
		block  []byte
		stream uint32
	)
	for total := len(preface); ; {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return false, false
		}
		n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
		typ, flags := http2.FrameType(hdr[3]), http2.Flags(hdr[4])
		id := binary.BigEndian.Uint32(hdr[5:]) & (1<<31 - 1)
		if total += 9 + n; total > sniffLimit || n > 16384 {
			return false, true
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(r, payload); err != nil {
			return false, false
		}
		switch {
		case block == nil && typ == http2.FrameHeaders:
			frag, ok := headerFragment(payload, flags)
			if !ok {
				return false, true
			}
			block, stream = append([]byte{}, frag...), id
		case block != nil && typ == http2.FrameContinuation && id == stream:
			block = append(block, payload...)
		case block == nil && (typ == http2.FrameSettings || typ == http2.FrameWindowUpdate || typ == http2.FramePriority):
			continue
		default:
			return false, true
		}
		if flags.Has(http2.FlagHeadersEndHeaders) {
			break
		}
	}
	path, ok := pathOf(block)
	if !ok {
		return false, true
	}
	_, unary := s.methods[path]
	return unary, true
}

// headerFragment is a HEADERS payload without its padding and priority.
func headerFragment(p []byte, flags http2.Flags) ([]byte, bool) {
	pad := 0
	if flags.Has(http2.FlagHeadersPadded) {
		if len(p) < 1 {
			return nil, false
		}
		pad, p = int(p[0]), p[1:]
	}
	if flags.Has(http2.FlagHeadersPriority) {
		if len(p) < 5 {
			return nil, false
		}
		p = p[5:]
	}
	if pad > len(p) {
		return nil, false
	}
	return p[:len(p)-pad], true
}

// pathOf is the :path of a connection's first header block (whose
// dynamic-table references can only be to entries it adds itself).
func pathOf(block []byte) (string, bool) {
	var path string
	d := hpack.NewDecoder(4096, func(f hpack.HeaderField) {
		if f.Name == ":path" {
			path = f.Value
		}
	})
	d.SetMaxStringLength(sniffLimit)
	if _, err := d.Write(block); err != nil || d.Close() != nil {
		return "", false
	}
	return path, path != ""
}

// recorder keeps what is read through it.
type recorder struct {
	r   io.Reader
	buf bytes.Buffer
}

func (r *recorder) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.buf.Write(p[:n])
	return n, err
}

// replayConn is a connection whose first bytes are read again: those its
// sniff took.
type replayConn struct {
	net.Conn
	pending []byte
}

func (c *replayConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}
