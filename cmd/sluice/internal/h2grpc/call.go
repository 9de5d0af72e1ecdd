package h2grpc

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

type callState uint8

const (
	receiving callState = iota // headers in, the request arriving
	running                    // with a worker
)

// call is one stream: a unary call from its headers to its answer. The
// reader and the janitor touch it under its conn's mu; once running, its
// worker owns body, ctx and m until it takes mu to answer.
type call struct {
	c        *conn
	id       uint32
	m        method
	codec    encoding.CodecV2 // nil: protobuf, decoded directly
	ctype    []byte           // the content-type field of the answer, encoded
	headers  []byte           // the answer's headers, encoded
	deadline time.Time
	body     []byte

	// Guarded by c.mu.
	state       callState
	ended       bool  // the client's END_STREAM arrived
	answered    bool  // our END_STREAM (or RST_STREAM) went out
	reset       bool  // the client reset it, or the connection ended
	recvUsed    int64 // stream window consumed of what we granted
	recvUnacked uint32
	sendWindow  int64
	cancel      context.CancelFunc
	admitted    bool   // holds a place in the server-wide budget (Config.Admit)
	httpStatus  uint16 // the :status of an answer without message; 0: 200
}

// msgNoRequest answers a call without a request message, in grpc-go's words
// (as are the other errors of a request's body).
const msgNoRequest = "cardinality violation: received no request message from non-client-streaming RPC"

// bodies keeps request and answer buffers between calls.
var bodies = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

func getBuf() []byte { return (*bodies.Get().(*[]byte))[:0] }

func putBuf(b []byte) {
	if cap(b) <= 64<<10 {
		bodies.Put(&b)
	}
}

// headers opens a stream (or ends one with trailers of the client).
func (c *conn) headers(f *http2.MetaHeadersFrame) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		// A write failed (or the janitor ended the connection) while the
		// reader still had frames read: they open no stream, since nothing
		// would end it (closeLocked has run) to give its place back.
		return false
	}
	id := f.StreamID
	if id%2 == 0 {
		c.failLocked(http2.ErrCodeProtocol, "even stream id")
		return false
	}
	if id <= c.lastID {
		if st := c.streams[id]; st != nil && st.state == receiving && !st.ended && f.StreamEnded() {
			c.requestEndedLocked(st) // the client's trailers
			return true
		}
		c.failLocked(http2.ErrCodeStreamClosed, "headers on a closed stream")
		return false
	}
	c.lastID = id
	if c.goingAway || c.open >= int(c.s.cfg.MaxStreams) {
		_ = c.fr.WriteRSTStream(id, http2.ErrCodeRefusedStream)
		c.flushLocked()
		return true
	}
	st := &call{c: c, id: id, sendWindow: int64(c.peerWindow), deadline: time.Now().Add(c.s.cfg.RecvTimeout)}
	c.streams[id] = st
	c.open++
	st.ended = f.StreamEnded()
	code, msg := st.parse(f)
	if code == codeReset {
		c.rstLocked(st, http2.ErrCodeProtocol)
		return true
	}
	if f.Truncated {
		code, msg = codeResourceExhausted, "sluice: the request's header fields are too large"
	}
	if code == codeOK && st.ended {
		code, msg = codeInternal, msgNoRequest
	}
	if code == codeOK && c.s.cfg.Admit != nil {
		if st.admitted = c.s.cfg.Admit(); !st.admitted {
			code, msg = codeResourceExhausted, "sluice: too many requests in flight, try again"
		}
	}
	if code != codeOK {
		c.answerLocked(st, code, msg)
		c.endLocked(st)
	}
	return true
}

// parse reads a call's header fields; a code other than codeOK is the
// answer to give at once (with st.httpStatus, when not 200), codeReset a
// malformed request to reset (RST_STREAM PROTOCOL_ERROR), unanswered. Its
// checks, their order and their answers are grpc-go's, so that a client
// cannot tell the two servers apart by a request they refuse.
func (st *call) parse(f *http2.MetaHeadersFrame) (code int, msg string) {
	st.ctype, st.headers = ctypeProto, headersProto
	var (
		isGRPC    bool
		ctype     string // the last content-type, when not gRPC's
		enc       string // grpc-encoding
		timeout   string // a malformed grpc-timeout's error
		expired   bool   // a grpc-timeout of 0
		malformed bool   // a connection field (RFC 9113 8.2.2)
		// :authority and host fields, even empty: grpc-go asks for one,
		// and no more than one of each.
		authorities, hosts int
	)
	for _, hf := range f.PseudoFields() {
		if hf.Name == ":authority" {
			authorities++
		}
	}
	for _, hf := range f.RegularFields() {
		switch hf.Name {
		case "content-type":
			sub, ok := contentSubtype(hf.Value)
			if !ok {
				ctype = hf.Value
				break
			}
			isGRPC = true
			switch sub {
			case "":
			case "proto":
				st.ctype, st.headers = ctypeProtoSub, headersProtoSub
			default:
				// A subtype without a codec is read as protobuf, as
				// grpc-go does (logging that it will not always).
				st.codec = codecFor(sub)
				if len(sub) <= maxSubtype {
					st.ctype = encodeContentType("application/grpc+" + sub)
					st.headers = append([]byte{status200}, st.ctype...)
				}
			}
		case "grpc-encoding":
			enc = hf.Value
		case "grpc-timeout":
			d, err := parseTimeout(hf.Value)
			if err != nil {
				timeout = "malformed grpc-timeout: " + err.Error()
				break
			}
			expired = d <= 0
			if dl := time.Now().Add(d); dl.Before(st.deadline) {
				st.deadline = dl
			}
		case "host":
			hosts++
		case "connection":
			malformed = true
		}
	}
	switch method := f.PseudoValue("method"); {
	case authorities > 1 || hosts > 1:
		st.httpStatus = 400
		return codeInternal, fmt.Sprintf("num values of :authority: %v, num values of host: %v, both must only have 1 value as per HTTP/2 spec", authorities, hosts)
	case malformed:
		return codeReset, ""
	case !isGRPC:
		st.httpStatus = 415
		return codeInvalidArgument, fmt.Sprintf("invalid gRPC request content-type %q", ctype)
	case timeout != "":
		st.httpStatus = 400
		return codeInternal, timeout
	case authorities+hosts == 0:
		st.httpStatus = 400
		return codeInternal, "no host or :authority header present"
	case method != "POST":
		st.httpStatus = 405
		return codeInternal, fmt.Sprintf("Received a HEADERS frame with :method %q which should be POST", method)
	case expired:
		return codeDeadlineExceeded, context.DeadlineExceeded.Error()
	}
	path := f.PseudoValue("path")
	m, ok := st.c.s.methods[path]
	if !ok {
		if st.c.s.streaming[path] {
			return codeUnimplemented, fmt.Sprintf("sluice: %s streams: call it on a connection of its own (this one serves unary calls)", path)
		}
		// As grpc-go words it.
		sm, found := strings.CutPrefix(path, "/")
		pos := strings.LastIndex(sm, "/")
		if !found || pos < 0 {
			return codeUnimplemented, fmt.Sprintf("malformed method name: %q", path)
		}
		svc := sm[:pos]
		if !st.c.s.services[svc] {
			return codeUnimplemented, fmt.Sprintf("unknown service %v", svc)
		}
		return codeUnimplemented, fmt.Sprintf("unknown method %v for service %v", sm[pos+1:], svc)
	}
	if enc != "" && enc != "identity" {
		return codeUnimplemented, fmt.Sprintf("grpc: Decompressor is not installed for grpc-encoding %q", enc)
	}
	st.m = m
	return codeOK, ""
}

// maxSubtype caps the content subtype an answer names: its header block,
// with a grpc-message of up to maxMessage bytes (3 times that, encoded),
// fits in a frame of 16384 bytes, the least a client can take.
const maxSubtype = 1024

// contentSubtype is the part of a gRPC content type after "+" or ";" (""
// for application/grpc alone), as grpc-go reads it, lower-cased.
func contentSubtype(ct string) (string, bool) {
	rest, ok := strings.CutPrefix(ct, "application/grpc")
	if !ok {
		return "", false
	}
	switch {
	case rest == "":
		return "", true
	case rest[0] == '+' || rest[0] == ';':
		return strings.ToLower(rest[1:]), true
	}
	return "", false
}

// data takes a piece of a request.
func (c *conn) data(f *http2.DataFrame) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := f.Header().Length
	if !c.consumeLocked(n) {
		return false
	}
	id := f.StreamID
	st := c.streams[id]
	if st == nil {
		if id > c.lastID {
			c.failLocked(http2.ErrCodeProtocol, "data on an idle stream")
			return false
		}
		return true // a stream answered or reset already: dropped
	}
	if st.state != receiving || st.ended {
		return true
	}
	if st.recvUsed += int64(n); st.recvUsed > int64(c.s.cfg.StreamWindow) {
		c.rstLocked(st, http2.ErrCodeFlowControl)
		return true
	}
	if st.body == nil {
		st.body = getBuf()
	}
	st.body = append(st.body, f.Data()...)
	limit := c.s.cfg.MaxRequestBytes
	if len(st.body) >= 5 {
		// grpc-go's checks, in its order: the size, the flag, the count.
		size := binary.BigEndian.Uint32(st.body[1:5])
		code, msg := codeOK, ""
		switch {
		case int64(size) > int64(limit):
			code, msg = codeResourceExhausted, fmt.Sprintf("grpc: received message larger than max (%d vs. %d)", size, limit)
		case st.body[0] == 1:
			code, msg = codeInternal, "grpc: compressed flag set with identity or empty encoding"
		case st.body[0] != 0:
			code, msg = codeInternal, fmt.Sprintf("grpc: received unexpected payload format %d", st.body[0])
		case len(st.body) > 5+int(size):
			code, msg = codeInternal, "cardinality violation: received multiple request messages for non-client-streaming RPC"
		}
		if code != codeOK {
			st.ended = f.StreamEnded()
			c.answerLocked(st, code, msg)
			c.endLocked(st)
			return true
		}
	}
	if f.StreamEnded() {
		c.requestEndedLocked(st)
		return true
	}
	if st.recvUnacked += n; st.recvUnacked >= c.s.cfg.StreamWindow/2 {
		_ = c.fr.WriteWindowUpdate(id, st.recvUnacked)
		c.flushLocked()
		st.recvUsed -= int64(st.recvUnacked)
		st.recvUnacked = 0
	}
	return true
}

// requestEndedLocked hands a whole request to a worker.
func (c *conn) requestEndedLocked(st *call) {
	st.ended = true
	if len(st.body) < 5 || len(st.body) != 5+int(binary.BigEndian.Uint32(st.body[1:5])) {
		msg := "unexpected EOF"
		if len(st.body) == 0 {
			msg = msgNoRequest
		}
		c.answerLocked(st, codeInternal, msg)
		c.endLocked(st)
		return
	}
	st.state = running
	var ctx context.Context
	ctx, st.cancel = context.WithDeadline(c.ctx, st.deadline)
	if c.s.cfg.Inline || c.s.cfg.InlineAlone && c.open == 1 && c.br.Buffered() == 0 {
		c.ready = append(c.ready, work{st, ctx}) // run by the reader once it lets go of mu
		return
	}
	c.s.dispatch(st, ctx)
}

// run answers the call: it decodes the request, calls the handler and
// writes the answer. inline says it runs on the connection's reader (see
// Config.Inline): then an answer the client's windows cannot take at once
// is left to a goroutine of its own, since only the reader can read the
// WINDOW_UPDATE it waits for.
func (st *call) run(ctx context.Context, inline bool) {
	resp, err := st.m.handler(st.m.impl, ctx, st.decode, nil)
	var out []byte
	if err == nil {
		out, err = st.encode(resp)
	}
	putBuf(st.body)
	st.body = nil
	if inline && err == nil {
		c := st.c
		c.mu.Lock()
		short := int64(len(out)) > min(st.sendWindow, c.sendWindow)
		c.mu.Unlock()
		if short {
			go st.answer(out, nil)
			return
		}
	}
	st.answer(out, err)
}

// answer writes the handler's answer (out, or err's status) and ends the
// call.
func (st *call) answer(out []byte, err error) {
	c := st.c
	c.mu.Lock()
	if err != nil {
		s, ok := status.FromError(err)
		if !ok {
			s = status.FromContextError(err)
		}
		c.answerLocked(st, int(s.Code()), s.Message())
	} else {
		c.respondLocked(st, out)
	}
	c.endLocked(st)
	c.mu.Unlock()
	st.cancel()
	if out != nil {
		putBuf(out)
	}
}

// decode is the handler's decoder of the request. Its error is INTERNAL, as
// grpc-go's (a handler returns it as it is: left alone, it would be
// answered UNKNOWN).
func (st *call) decode(v any) error {
	msg := st.body[5:]
	var err error
	if m, ok := v.(proto.Message); ok && st.codec == nil {
		err = proto.Unmarshal(msg, m)
	} else {
		codec := st.codec
		if codec == nil {
			codec = encoding.GetCodecV2("proto")
		}
		err = codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(msg)}, v)
	}
	if err != nil {
		return status.Errorf(codeInternal, "grpc: failed to unmarshal the received message: %v", err)
	}
	return nil
}

// encode is the answer's message with its 5-byte prefix.
func (st *call) encode(v any) ([]byte, error) {
	b := append(getBuf(), 0, 0, 0, 0, 0)
	var err error
	if m, ok := v.(proto.Message); ok && st.codec == nil {
		b, err = proto.MarshalOptions{}.MarshalAppend(b, m)
	} else {
		codec := st.codec
		if codec == nil {
			codec = encoding.GetCodecV2("proto")
		}
		var data mem.BufferSlice
		if data, err = codec.Marshal(v); err == nil {
			b = append(b, data.Materialize()...)
			data.Free()
		}
	}
	if err != nil {
		putBuf(b)
		return nil, status.Errorf(13, "grpc: error while marshaling: %v", err)
	}
	binary.BigEndian.PutUint32(b[1:5], uint32(len(b)-5))
	return b, nil
}

// respondLocked writes a whole answer: headers, the message in DATA frames
// as the client's windows allow, and the trailers.
func (c *conn) respondLocked(st *call, out []byte) {
	if st.answered || st.reset || c.closed {
		return
	}
	_ = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: st.id, BlockFragment: st.headers, EndHeaders: true})
	for len(out) > 0 {
		// Checked at each turn, not only when the window is short: the
		// client may reset the stream while it waits, and open the
		// window then for its other streams.
		if st.reset || c.closed {
			return
		}
		n := min(int64(len(out)), st.sendWindow, c.sendWindow, int64(c.peerFrame))
		if n <= 0 {
			if time.Now().After(st.deadline) {
				c.rstLocked(st, http2.ErrCodeCancel)
				return
			}
			c.flushLocked()
			c.windowed.Wait()
			continue
		}
		_ = c.fr.WriteData(st.id, false, out[:n])
		c.answered = true // as grpc-go: DATA forgives the pings before it (a client's BDP pings follow DATA)
		out = out[n:]
		st.sendWindow -= n
		c.sendWindow -= n
	}
	_ = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: st.id, BlockFragment: trailersOK, EndHeaders: true, EndStream: true})
	st.answered = true
	c.answered = true
	c.flushLocked()
}

// answerLocked ends a stream with a status and no message (a trailers-only
// answer), then, if the client may still be sending, tells it to stop
// (RST_STREAM NO_ERROR).
func (c *conn) answerLocked(st *call, code int, msg string) {
	if st.answered || st.reset || c.closed {
		return
	}
	var block []byte
	if st.httpStatus == 0 {
		block = append([]byte{status200}, st.ctype...)
	} else {
		block = append(appendField(nil, ":status", strconv.Itoa(int(st.httpStatus))), st.ctype...)
	}
	block = appendStatus(block, code, msg)
	_ = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: st.id, BlockFragment: block, EndHeaders: true, EndStream: true})
	st.answered = true
	c.answered = true
	if !st.ended {
		_ = c.fr.WriteRSTStream(st.id, http2.ErrCodeNo)
	}
	c.flushLocked()
}

// rstLocked resets a stream with code.
func (c *conn) rstLocked(st *call, code http2.ErrCode) {
	if !st.answered && !c.closed {
		_ = c.fr.WriteRSTStream(st.id, code)
		c.flushLocked()
	}
	st.answered = true
	st.resetLocked()
}

// resetLocked ends a stream the client or the connection gave up: one still
// receiving ends now; a running one's handler is cancelled, and the stream
// counts against MaxStreams until it returns.
func (st *call) resetLocked() {
	st.reset = true
	if st.state == receiving {
		st.c.endLocked(st)
	} else if st.cancel != nil {
		st.cancel()
		st.c.windowed.Broadcast() // its answer may wait for window: it ends now
	}
}

// endLocked takes a stream out of the connection, and gives back its place
// in the server-wide budget.
func (c *conn) endLocked(st *call) {
	if c.streams[st.id] != st {
		return
	}
	delete(c.streams, st.id)
	if st.state == receiving && st.body != nil {
		putBuf(st.body)
		st.body = nil
	}
	if st.admitted && c.s.cfg.Release != nil {
		c.s.cfg.Release()
	}
	if c.open--; c.open == 0 {
		c.idleSince = time.Now()
		if c.goingAway {
			c.closeLocked()
		}
	}
}

// codecFor is the codec registered for a content subtype, as grpc-go finds
// it: a CodecV2, or a Codec (encoding.RegisterCodec, as leasegrpc's "json").
func codecFor(sub string) encoding.CodecV2 {
	if c := encoding.GetCodecV2(sub); c != nil {
		return c
	}
	if c := encoding.GetCodec(sub); c != nil {
		return codecV1{c}
	}
	return nil
}

// codecV1 serves an encoding.Codec as a CodecV2.
type codecV1 struct{ c encoding.Codec }

func (c codecV1) Marshal(v any) (mem.BufferSlice, error) {
	b, err := c.c.Marshal(v)
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

func (c codecV1) Unmarshal(data mem.BufferSlice, v any) error {
	return c.c.Unmarshal(data.Materialize(), v)
}
func (c codecV1) Name() string { return c.c.Name() }
