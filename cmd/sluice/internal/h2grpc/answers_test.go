package h2grpc_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sluice-go/sluice/cmd/sluice/internal/h2grpc"
)

// oddCall is a request a well-behaved client does not send: its header
// fields (all of them) and its body (nil: none, END_STREAM on the
// HEADERS).
type oddCall struct {
	name   string
	fields []hpack.HeaderField
	body   []byte
}

// callFields are a call's header fields: a POST of path with ctype ("": no
// content-type), then extra.
func callFields(path, ctype string, extra ...hpack.HeaderField) []hpack.HeaderField {
	fs := []hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
		{Name: ":path", Value: path}, {Name: ":authority", Value: "sluice"}}
	if ctype != "" {
		fs = append(fs, hpack.HeaderField{Name: "content-type", Value: ctype})
	}
	return append(fs, extra...)
}

// send sends c on stream id.
func (r *raw) sendOdd(id uint32, c oddCall) {
	r.t.Helper()
	r.hbuf.Reset()
	for _, f := range c.fields {
		require.NoError(r.t, r.enc.WriteField(f))
	}
	require.NoError(r.t, r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.hbuf.Bytes(),
		EndHeaders: true, EndStream: c.body == nil}))
	if c.body != nil {
		r.send(id, c.body, true)
	}
}

// TestAnswersAsGRPCGo: requests a client gets wrong are answered by h2grpc
// as grpc-go answers them (status, message, :status, content-type), each
// sent to both: to h2grpc on a connection it keeps, to grpc-go on one
// handed over (its first call streams).
func TestAnswersAsGRPCGo(t *testing.T) {
	// grpc-go's default limit, for the same answer to a message past it.
	f := start(t, h2grpc.Config{MaxRequestBytes: 4 << 20}, fixtureOpt{handoff: true})
	fast := fastRaw(t, f)
	slow := dialRaw(t, f.addr)
	slow.open(1, streamPath, false) // grpc-go's from here on
	get := callFields(echoPath, "application/grpc")
	get[0].Value = "GET"
	noAuthority := callFields(echoPath, "application/grpc")
	noAuthority = append(noAuthority[:3], noAuthority[4:]...)
	hostOnly := append(slices.Clone(noAuthority), hpack.HeaderField{Name: "host", Value: "sluice"})
	emptyAuthority := callFields(echoPath, "application/grpc")
	emptyAuthority[3].Value = ""
	for _, tc := range []oddCall{
		{"a message that does not decode", callFields(echoPath, "application/grpc"), frameMsg([]byte{0xff, 0xff, 0xff})},
		{"no content-type", callFields(echoPath, ""), msg("x")},
		{"content-type not gRPC's", callFields(echoPath, "text/plain"), msg("x")},
		{"content-type application/grpcx", callFields(echoPath, "application/grpcx"), msg("x")},
		{"content subtype proto", callFields(echoPath, "application/grpc+proto"), msg("x")},
		{"an unknown content subtype", callFields(echoPath, "application/grpc+xyz"), msg("x")},
		{"a content-type with parameters", callFields(echoPath, "application/grpc;charset=utf-8"), msg("x")},
		{"GET", get, msg("x")},
		{"no :authority", noAuthority, msg("x")},
		{"host, no :authority", hostOnly, msg("x")},
		{"an empty :authority", emptyAuthority, msg("x")},
		{"two host fields", append(slices.Clone(hostOnly), hpack.HeaderField{Name: "host", Value: "other"}), msg("x")},
		{"two host fields and :authority", callFields(echoPath, "application/grpc",
			hpack.HeaderField{Name: "host", Value: "a"}, hpack.HeaderField{Name: "host", Value: "b"}), msg("x")},
		{"an unknown compressor", callFields(echoPath, "application/grpc", hpack.HeaderField{Name: "grpc-encoding", Value: "snappy"}), msg("x")},
		{"identity encoding", callFields(echoPath, "application/grpc", hpack.HeaderField{Name: "grpc-encoding", Value: "identity"}), msg("x")},
		{"empty encoding", callFields(echoPath, "application/grpc", hpack.HeaderField{Name: "grpc-encoding", Value: ""}), msg("x")},
		{"a grpc-timeout unit unknown", callFields(echoPath, "application/grpc", hpack.HeaderField{Name: "grpc-timeout", Value: "5x"}), msg("x")},
		{"a grpc-timeout signed", callFields(echoPath, "application/grpc", hpack.HeaderField{Name: "grpc-timeout", Value: "+5S"}), msg("x")},
		{"a grpc-timeout too long", callFields(echoPath, "application/grpc", hpack.HeaderField{Name: "grpc-timeout", Value: "123456789S"}), msg("x")},
		{"a grpc-timeout of 0", callFields(echoPath, "application/grpc", hpack.HeaderField{Name: "grpc-timeout", Value: "0S"}), msg("x")},
		{"a path without a slash", callFields("nope", "application/grpc"), msg("x")},
		{"a path with a slash too many", callFields("/"+svcName+"/Echo/x", "application/grpc"), msg("x")},
		{"an unknown service", callFields("/nope.Nope/Echo", "application/grpc"), msg("x")},
		{"an unknown method", callFields("/"+svcName+"/Nope", "application/grpc"), msg("x")},
		{"an unknown method and compressor", callFields("/"+svcName+"/Nope", "application/grpc", hpack.HeaderField{Name: "grpc-encoding", Value: "snappy"}), msg("x")},
		{"no message", callFields(echoPath, "application/grpc"), nil},
		{"an empty DATA frame, no message", callFields(echoPath, "application/grpc"), []byte{}},
		{"two messages", callFields(echoPath, "application/grpc"), append(msg("a"), msg("b")...)},
		{"the request ends inside its message", callFields(echoPath, "application/grpc"), msg("abcdef")[:7]},
		{"the request ends inside its prefix", callFields(echoPath, "application/grpc"), []byte{0, 0}},
		{"the compressed flag", callFields(echoPath, "application/grpc"), append([]byte{1}, msg("x")[1:]...)},
		{"a payload format unknown", callFields(echoPath, "application/grpc"), append([]byte{2}, msg("x")[1:]...)},
		{"the compressed flag on a message too large", callFields(echoPath, "application/grpc"), []byte{1, 1, 0, 0, 0}},
		{"a message too large", callFields(echoPath, "application/grpc"), []byte{0, 1, 0, 0, 0}},
		{"GET without content-type", append(slices.Clone(get[:4]), get[5:]...), msg("x")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := uint32(len(fast.streams))*2 + 1
			fast.sendOdd(id, tc)
			got := fast.ended(id)
			sid := uint32(len(slow.streams))*2 + 3
			slow.sendOdd(sid, tc)
			want := slow.ended(sid)
			require.NotNil(t, want.trailers, "grpc-go's answer: %v", slow.describe())
			require.NotNil(t, got.trailers, "h2grpc's answer: %v", fast.describe())
			assert.Equal(t, answerOf(want), answerOf(got))
		})
	}
}

// answerOf is what a client sees of an answer: its :status and
// content-type, its message, its grpc-status and grpc-message.
func answerOf(s *rawStream) [5]string {
	return [5]string{s.headers[":status"], s.headers["content-type"], string(s.data),
		s.trailers["grpc-status"], s.trailers["grpc-message"]}
}

// TestLongContentSubtype: an answer's content-type names the request's
// subtype, as grpc-go's does, but not one so long that the answer's header
// block would not fit in a frame (16384 bytes, the client's
// SETTINGS_MAX_FRAME_SIZE).
func TestLongContentSubtype(t *testing.T) {
	f := start(t, h2grpc.Config{}, fixtureOpt{})
	r := fastRaw(t, f)
	sub := strings.Repeat("s", 20000)
	r.sendOdd(3, oddCall{"", callFields(echoPath, "application/grpc+"+sub), msg("long")})
	s := r.ended(3)
	assert.Equal(t, 0, s.status())
	assert.Equal(t, msg("long"), s.data)
	assert.True(t, s.headers["content-type"] == "application/grpc", "a content-type of %d bytes", len(s.headers["content-type"]))
	for _, fi := range r.frames {
		assert.LessOrEqual(t, fi.length, uint32(16384), "a %v frame", fi.typ)
	}
	r.sendOdd(5, oddCall{"", callFields(echoPath, "application/grpc+"+sub[:100]), msg("short")})
	assert.Equal(t, "application/grpc+"+sub[:100], r.ended(5).headers["content-type"])
}

// TestConnectionHeaderAsGRPCGo: a request with a connection header field,
// malformed in HTTP/2 (RFC 9113 8.2.2), is reset PROTOCOL_ERROR, unanswered,
// as grpc-go resets it.
func TestConnectionHeaderAsGRPCGo(t *testing.T) {
	f := start(t, h2grpc.Config{}, fixtureOpt{handoff: true})
	fast := fastRaw(t, f)
	slow := dialRaw(t, f.addr)
	slow.open(1, streamPath, false) // grpc-go's from here on
	c := oddCall{"", callFields(echoPath, "application/grpc", hpack.HeaderField{Name: "connection", Value: "keep-alive"}), msg("x")}
	calls := f.svc.echoCalls.Load()
	slow.sendOdd(3, c)
	want := slow.ended(3)
	require.NotNil(t, want.rst, "grpc-go's answer: %v", slow.describe())
	fast.sendOdd(3, c)
	got := fast.ended(3)
	require.NotNil(t, got.rst, "h2grpc's answer: %v", fast.describe())
	assert.Equal(t, *want.rst, *got.rst)
	assert.Equal(t, want.trailers, got.trailers)
	assert.Equal(t, calls, f.svc.echoCalls.Load(), "a handler ran")
	fast.unaryCall(5, echoPath, "still here")
	assert.Equal(t, 0, fast.ended(5).status())
}
