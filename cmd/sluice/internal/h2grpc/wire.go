package h2grpc

import (
	"bytes"
	"fmt"
	"strconv"
	"time"

	"golang.org/x/net/http2"
)

// gRPC status codes this package answers with itself (google.golang.org/grpc/codes).
const (
	codeOK                = 0
	codeInvalidArgument   = 3
	codeDeadlineExceeded  = 4
	codeResourceExhausted = 8
	codeUnimplemented     = 12
	codeInternal          = 13

	codeReset = -1 // no status: the stream is reset
)

// Why answers are encoded by hand, and none is added to the HPACK dynamic
// table: then encoding needs no state shared by the calls of a connection,
// and the common blocks are constants. Each field is either an exact match
// of the static table (":status: 200") or a literal that is never indexed.
var (
	status200       byte = 0x88 // ":status: 200", static table entry 8
	ctypeProto           = encodeContentType("application/grpc")
	headersProto         = append([]byte{status200}, ctypeProto...)
	ctypeProtoSub        = encodeContentType("application/grpc+proto") // answers a request's own
	headersProtoSub      = append([]byte{status200}, ctypeProtoSub...)
	trailersOK           = appendField(nil, "grpc-status", "0")
)

func encodeContentType(v string) []byte { return appendField(nil, "content-type", v) }

// appendField appends name: value as a literal field never indexed, with a
// literal name (RFC 7541 6.2.3).
func appendField(b []byte, name, value string) []byte {
	b = append(b, 0x10)
	b = appendString(b, name)
	return appendString(b, value)
}

// appendString appends s as an HPACK string literal, not Huffman-coded.
func appendString(b []byte, s string) []byte {
	b = appendInt(b, 7, 0, uint64(len(s)))
	return append(b, s...)
}

// appendInt appends v as an HPACK integer with an n-bit prefix, the
// first byte's other bits set to first (RFC 7541 5.1).
func appendInt(b []byte, n uint, first byte, v uint64) []byte {
	limit := uint64(1)<<n - 1
	if v < limit {
		return append(b, first|byte(v))
	}
	b = append(b, first|byte(limit))
	for v -= limit; v >= 128; v >>= 7 {
		b = append(b, byte(v&0x7f|0x80))
	}
	return append(b, byte(v))
}

// maxMessage caps the grpc-message of an answer.
const maxMessage = 1024

// appendStatus appends grpc-status and, when msg is not empty,
// grpc-message (percent-encoded as gRPC asks).
func appendStatus(b []byte, code int, msg string) []byte {
	b = appendField(b, "grpc-status", strconv.Itoa(code))
	if msg == "" {
		return b
	}
	if len(msg) > maxMessage {
		msg = msg[:maxMessage]
	}
	return appendField(b, "grpc-message", percentEncode(msg))
}

// percentEncode encodes the bytes of s outside printable ASCII, and '%'.
func percentEncode(s string) string {
	var out []byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c <= 0x7e && c != '%' {
			if out != nil {
				out = append(out, c)
			}
			continue
		}
		if out == nil {
			out = append(make([]byte, 0, len(s)+8), s[:i]...)
		}
		out = append(out, '%', "0123456789ABCDEF"[c>>4], "0123456789ABCDEF"[c&15])
	}
	if out == nil {
		return s
	}
	return string(out)
}

// parseTimeout reads a grpc-timeout value: up to 8 digits and a unit. Its
// errors are grpc-go's.
func parseTimeout(v string) (time.Duration, error) {
	if len(v) < 2 {
		return 0, fmt.Errorf("transport: timeout string is too short: %q", v)
	}
	if len(v) > 9 {
		return 0, fmt.Errorf("transport: timeout string is too long: %q", v)
	}
	var unit time.Duration
	switch v[len(v)-1] {
	case 'H':
		unit = time.Hour
	case 'M':
		unit = time.Minute
	case 'S':
		unit = time.Second
	case 'm':
		unit = time.Millisecond
	case 'u':
		unit = time.Microsecond
	case 'n':
		unit = time.Nanosecond
	default:
		return 0, fmt.Errorf("transport: timeout unit is not recognized: %q", v)
	}
	n, err := strconv.ParseUint(v[:len(v)-1], 10, 64)
	if err != nil {
		return 0, err
	}
	if n > uint64(1<<62)/uint64(unit) {
		return 1 << 62, nil
	}
	return time.Duration(n) * unit, nil
}

// settingsFrame is the server's SETTINGS frame: the values grpc-go sends
// for the same bounds (see sniff).
func (s *Server) settingsFrame() []byte {
	var b bytes.Buffer
	fr := http2.NewFramer(&b, nil)
	settings := []http2.Setting{{ID: http2.SettingMaxFrameSize, Val: 16384}, {ID: http2.SettingMaxConcurrentStreams, Val: s.cfg.MaxStreams}}
	if s.cfg.StreamWindow != 65535 {
		settings = append(settings, http2.Setting{ID: http2.SettingInitialWindowSize, Val: s.cfg.StreamWindow})
	}
	_ = fr.WriteSettings(settings...)
	return b.Bytes()
}
