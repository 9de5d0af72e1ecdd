package h2grpc

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2/hpack"
)

// decode decodes an HPACK block with x/net's decoder, failing on an error.
func decode(t *testing.T, block []byte) []hpack.HeaderField {
	t.Helper()
	d := hpack.NewDecoder(4096, nil)
	fields, err := d.DecodeFull(block)
	require.NoError(t, err)
	return fields
}

func TestAppendField(t *testing.T) {
	long := strings.Repeat("v", 300) // a length past the 7-bit prefix
	for _, tc := range []struct{ name, value string }{
		{"grpc-status", "0"}, {"content-type", "application/grpc"}, {"x-long", long}, {"x-empty", ""},
		{"x-126", strings.Repeat("a", 126)}, {"x-127", strings.Repeat("a", 127)}, {"x-128", strings.Repeat("a", 128)},
		{"x-huge", strings.Repeat("h", 70000)},
	} {
		got := decode(t, appendField(nil, tc.name, tc.value))
		assert.Equal(t, []hpack.HeaderField{{Name: tc.name, Value: tc.value, Sensitive: true}}, got, tc.name)
	}
	// Never indexed: decoding changes no dynamic table, so a second
	// decoder state sees the same.
	d := hpack.NewDecoder(4096, nil)
	_, err := d.DecodeFull(appendField(nil, "a", "b"))
	require.NoError(t, err)
	_, err = d.DecodeFull([]byte{0xbe}) // dynamic index 62: must not exist
	assert.Error(t, err)
}

func TestAnswerBlocks(t *testing.T) {
	head := append([]byte{status200}, ctypeProto...)
	assert.Equal(t, []hpack.HeaderField{{Name: ":status", Value: "200"}, {Name: "content-type", Value: "application/grpc", Sensitive: true}},
		decode(t, head))
	assert.Equal(t, []hpack.HeaderField{{Name: "grpc-status", Value: "0", Sensitive: true}}, decode(t, trailersOK))
}

func TestAppendStatus(t *testing.T) {
	assert.Equal(t, []hpack.HeaderField{{Name: "grpc-status", Value: "5", Sensitive: true}},
		decode(t, appendStatus(nil, 5, "")))
	got := decode(t, appendStatus(nil, 13, "100% sûr"))
	assert.Equal(t, []hpack.HeaderField{{Name: "grpc-status", Value: "13", Sensitive: true},
		{Name: "grpc-message", Value: "100%25 s%C3%BBr", Sensitive: true}}, got)

	long := strings.Repeat("m", 5000)
	got = decode(t, appendStatus(nil, 2, long))
	require.Len(t, got, 2)
	assert.Equal(t, long[:maxMessage], got[1].Value, "cut at maxMessage")
}

func TestPercentEncode(t *testing.T) {
	for in, want := range map[string]string{
		"":                 "",
		"plain text ~!":    "plain text ~!",
		"%":                "%25",
		"50% off":          "50%25 off",
		"é":                "%C3%A9",
		"tab\there":        "tab%09here",
		"\x00\x1f\x7f\xff": "%00%1F%7F%FF",
		" ":                " ",
		"~":                "~",
	} {
		assert.Equal(t, want, percentEncode(in), "%q", in)
	}
	s := "no change"
	assert.Equal(t, s, percentEncode(s))
}

func TestParseTimeout(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"1H", time.Hour, true},
		{"2M", 2 * time.Minute, true},
		{"3S", 3 * time.Second, true},
		{"4m", 4 * time.Millisecond, true},
		{"5u", 5 * time.Microsecond, true},
		{"6n", 6, true},
		{"0S", 0, true},
		{"00000001m", time.Millisecond, true},       // 8 digits
		{"99999999n", 99999999, true},               // 8 digits
		{"99999999S", 99999999 * time.Second, true}, // 8 digits
		{"99999999H", 1 << 62, true},                // clamped, not overflowed
		{"99999999M", 1 << 62, true},                // clamped
		{"1000000M", 1000000 * time.Minute, true},   // under 2^62
		{"999999999n", 0, false},                    // 9 digits
		{"S", 0, false},                             // no digits
		{"", 0, false},
		{"10", 0, false},   // no unit
		{"10s", 0, false},  // units are case-sensitive
		{"10x", 0, false},  // no such unit
		{"-1S", 0, false},  // negative
		{"+1S", 0, false},  // signed
		{"1.5S", 0, false}, // not an integer
		{" 1S", 0, false},
		{"1 S", 0, false},
	} {
		got, err := parseTimeout(tc.in)
		assert.Equal(t, tc.ok, err == nil, "%q: %v", tc.in, err)
		if tc.ok {
			assert.Equal(t, tc.want, got, "%q", tc.in)
		}
	}
}

func TestContentSubtype(t *testing.T) {
	for _, tc := range []struct {
		in, sub string
		ok      bool
	}{
		{"application/grpc", "", true},
		{"application/grpc+proto", "proto", true},
		{"application/grpc+JSON", "json", true},
		{"application/grpc;charset=utf-8", "charset=utf-8", true}, // as grpc-go reads it
		{"application/grpcx", "", false},
		{"application/json", "", false},
		{"", "", false},
	} {
		sub, ok := contentSubtype(tc.in)
		assert.Equal(t, tc.ok, ok, "%q", tc.in)
		assert.Equal(t, tc.sub, sub, "%q", tc.in)
	}
}

// TestSettingsFrame: the server's SETTINGS name MaxStreams, and the stream
// window only when it is not HTTP/2's default.
func TestSettingsFrame(t *testing.T) {
	s := New(Config{MaxStreams: 7, StreamWindow: 65535}, 0)
	b := s.settingsFrame()
	// MAX_FRAME_SIZE 16384 first, as grpc-go sends it.
	assert.Equal(t, []byte{0, 0, 12, 4, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0x40, 0, 0, 3, 0, 0, 0, 7}, b)
	s = New(Config{MaxStreams: 7, StreamWindow: 1 << 20}, 0)
	assert.Equal(t, []byte{0, 0, 18, 4, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0x40, 0, 0, 3, 0, 0, 0, 7, 0, 4, 0, 0x10, 0, 0}, s.settingsFrame())
}
