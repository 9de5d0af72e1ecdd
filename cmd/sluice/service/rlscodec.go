package service

import (
	"encoding/binary"
	"errors"
	"math/bits"
	"unicode/utf8"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the codec rlsCodec falls back to
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// RateLimitCodec is the gRPC codec for a server that RegisterRateLimitService
// registered on, to pass to grpc.ForceServerCodecV2. It speaks the same
// protobuf wire format as grpc-go's own codec (a client sees no difference)
// and is what that codec is for every other message (the health service's);
// it decodes ShouldRateLimit's request and encodes its response by hand.
//
// Why by hand: the stock codec walks a message through protobuf's
// reflection tables, sizes it, then marshals it; these two messages are
// small and fixed, and each request's strings can share one copy of its
// bytes instead of one allocation each. A request or response with anything
// the hand-written path does not cover (an unknown field, a field repeated
// where it is singular, text that is not UTF-8, a response field the
// service never sets) goes whole to the stock codec, so the answer (message
// or error) is always the one the stock codec gives.
//
// It is safe for concurrent use.
func RateLimitCodec() encoding.CodecV2 { return rlsCodec{} }

type rlsCodec struct{}

func (rlsCodec) Name() string { return "proto" }

// stock is grpc-go's protobuf codec.
func stock() encoding.CodecV2 { return encoding.GetCodecV2("proto") }

func (rlsCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*rlsv3.RateLimitResponse); ok && r != nil && plainResponse(r) {
		n := responseSize(r)
		// Why not the buffer pool: a response is tens of bytes, far below
		// grpc-go's pooling threshold, as in the stock codec.
		return mem.BufferSlice{mem.SliceBuffer(appendResponse(make([]byte, 0, n), r))}, nil
	}
	return stock().Marshal(v)
}

func (rlsCodec) Unmarshal(data mem.BufferSlice, v any) error {
	req, ok := v.(*rlsv3.RateLimitRequest)
	if !ok {
		return stock().Unmarshal(data, v)
	}
	var s string
	if len(data) == 1 {
		s = string(data[0].ReadOnlyData())
	} else {
		s = string(data.Materialize())
	}
	proto.Reset(req)
	if err := decodeRequest(s, req); err != nil {
		proto.Reset(req)
		return stock().Unmarshal(data, v)
	}
	return nil
}

// plainResponse reports whether r holds only what the hand-written encoder
// writes: overall_code and statuses with code, current_limit,
// limit_remaining and duration_until_reset, and no unknown fields.
func plainResponse(r *rlsv3.RateLimitResponse) bool {
	if len(r.ResponseHeadersToAdd) > 0 || len(r.RequestHeadersToAdd) > 0 || len(r.RawBody) > 0 ||
		r.DynamicMetadata != nil || r.Quota != nil || len(r.ProtoReflect().GetUnknown()) > 0 {
		return false
	}
	for _, st := range r.Statuses {
		if st == nil || st.Quota != nil || len(st.ProtoReflect().GetUnknown()) > 0 {
			return false
		}
		if l := st.CurrentLimit; l != nil && len(l.ProtoReflect().GetUnknown()) > 0 {
			return false
		}
		if l := st.CurrentLimit; l != nil && l.UnitMultiplier != nil && len(l.UnitMultiplier.ProtoReflect().GetUnknown()) > 0 {
			return false
		}
		if d := st.DurationUntilReset; d != nil && len(d.ProtoReflect().GetUnknown()) > 0 {
			return false
		}
	}
	return true
}

// Protobuf wire types.
const (
	wireVarint = 0
	wireBytes  = 2
)

func tag(field, wire int) uint64 { return uint64(field)<<3 | uint64(wire) }

func varintSize(v uint64) int { return (bits.Len64(v|1) + 6) / 7 }

// The sizes and appends below write fields in field-number order and leave
// out zero scalars, as the stock codec does, so the bytes are the same.

func responseSize(r *rlsv3.RateLimitResponse) int {
	n := 0
	if r.OverallCode != 0 {
		n += 1 + varintSize(uint64(r.OverallCode))
	}
	for _, st := range r.Statuses {
		m := statusSize(st)
		n += 1 + varintSize(uint64(m)) + m
	}
	return n
}

func appendResponse(b []byte, r *rlsv3.RateLimitResponse) []byte {
	if r.OverallCode != 0 {
		b = binary.AppendUvarint(b, tag(1, wireVarint))
		b = binary.AppendUvarint(b, uint64(r.OverallCode))
	}
	for _, st := range r.Statuses {
		b = binary.AppendUvarint(b, tag(2, wireBytes))
		b = binary.AppendUvarint(b, uint64(statusSize(st)))
		b = appendStatus(b, st)
	}
	return b
}

// Why int64 conversions for enums and int32s: protobuf writes a negative
// one as its 64-bit two's complement, ten bytes.

func statusSize(st *rlsv3.RateLimitResponse_DescriptorStatus) int {
	n := 0
	if st.Code != 0 {
		n += 1 + varintSize(uint64(int64(st.Code)))
	}
	if l := st.CurrentLimit; l != nil {
		m := limitSize(l)
		n += 1 + varintSize(uint64(m)) + m
	}
	if st.LimitRemaining != 0 {
		n += 1 + varintSize(uint64(st.LimitRemaining))
	}
	if d := st.DurationUntilReset; d != nil {
		m := durationSize(d)
		n += 1 + varintSize(uint64(m)) + m
	}
	return n
}

func appendStatus(b []byte, st *rlsv3.RateLimitResponse_DescriptorStatus) []byte {
	if st.Code != 0 {
		b = binary.AppendUvarint(b, tag(1, wireVarint))
		b = binary.AppendUvarint(b, uint64(int64(st.Code)))
	}
	if l := st.CurrentLimit; l != nil {
		b = binary.AppendUvarint(b, tag(2, wireBytes))
		b = binary.AppendUvarint(b, uint64(limitSize(l)))
		b = appendLimit(b, l)
	}
	if st.LimitRemaining != 0 {
		b = binary.AppendUvarint(b, tag(3, wireVarint))
		b = binary.AppendUvarint(b, uint64(st.LimitRemaining))
	}
	if d := st.DurationUntilReset; d != nil {
		b = binary.AppendUvarint(b, tag(4, wireBytes))
		b = binary.AppendUvarint(b, uint64(durationSize(d)))
		b = appendDuration(b, d)
	}
	return b
}

func limitSize(l *rlsv3.RateLimitResponse_RateLimit) int {
	n := 0
	if l.RequestsPerUnit != 0 {
		n += 1 + varintSize(uint64(l.RequestsPerUnit))
	}
	if l.Unit != 0 {
		n += 1 + varintSize(uint64(int64(l.Unit)))
	}
	if len(l.Name) > 0 {
		n += 1 + varintSize(uint64(len(l.Name))) + len(l.Name)
	}
	if m := l.UnitMultiplier; m != nil {
		k := 0
		if m.Value != 0 {
			k = 1 + varintSize(uint64(m.Value))
		}
		n += 1 + varintSize(uint64(k)) + k
	}
	return n
}

func appendLimit(b []byte, l *rlsv3.RateLimitResponse_RateLimit) []byte {
	if l.RequestsPerUnit != 0 {
		b = binary.AppendUvarint(b, tag(1, wireVarint))
		b = binary.AppendUvarint(b, uint64(l.RequestsPerUnit))
	}
	if l.Unit != 0 {
		b = binary.AppendUvarint(b, tag(2, wireVarint))
		b = binary.AppendUvarint(b, uint64(int64(l.Unit)))
	}
	if len(l.Name) > 0 {
		b = binary.AppendUvarint(b, tag(3, wireBytes))
		b = binary.AppendUvarint(b, uint64(len(l.Name)))
		b = append(b, l.Name...)
	}
	if m := l.UnitMultiplier; m != nil {
		b = binary.AppendUvarint(b, tag(4, wireBytes))
		if m.Value == 0 {
			b = append(b, 0)
		} else {
			b = binary.AppendUvarint(b, uint64(1+varintSize(uint64(m.Value))))
			b = binary.AppendUvarint(b, tag(1, wireVarint))
			b = binary.AppendUvarint(b, uint64(m.Value))
		}
	}
	return b
}

func durationSize(d *durationpb.Duration) int {
	n := 0
	if d.Seconds != 0 {
		n += 1 + varintSize(uint64(d.Seconds))
	}
	if d.Nanos != 0 {
		n += 1 + varintSize(uint64(int64(d.Nanos)))
	}
	return n
}

func appendDuration(b []byte, d *durationpb.Duration) []byte {
	if d.Seconds != 0 {
		b = binary.AppendUvarint(b, tag(1, wireVarint))
		b = binary.AppendUvarint(b, uint64(d.Seconds))
	}
	if d.Nanos != 0 {
		b = binary.AppendUvarint(b, tag(2, wireVarint))
		b = binary.AppendUvarint(b, uint64(int64(d.Nanos)))
	}
	return b
}

// errUncovered sends a request to the stock codec: either it is malformed
// (the stock codec says how) or it holds something decodeRequest does not
// decode. It never reaches a caller.
var errUncovered = errors.New("rls codec: not covered")

// wireReader reads protobuf fields from s. Strings it returns share s.
type wireReader struct{ s string }

func (r *wireReader) varint() (uint64, error) {
	var v uint64
	for i := 0; i < len(r.s) && i < binary.MaxVarintLen64; i++ {
		c := r.s[i]
		if i == binary.MaxVarintLen64-1 && c > 1 {
			return 0, errUncovered // overflows 64 bits
		}
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			r.s = r.s[i+1:]
			return v, nil
		}
	}
	return 0, errUncovered
}

// field reads a field's tag; wire must match want.
func (r *wireReader) field() (num int, wire int, err error) {
	t, err := r.varint()
	if err != nil || t>>3 == 0 || t>>3 > 1<<29-1 {
		return 0, 0, errUncovered
	}
	return int(t >> 3), int(t & 7), nil
}

// bytes reads a length-delimited field's contents.
func (r *wireReader) bytes() (string, error) {
	n, err := r.varint()
	if err != nil || n > uint64(len(r.s)) {
		return "", errUncovered
	}
	b := r.s[:n]
	r.s = r.s[n:]
	return b, nil
}

// text reads a proto3 string field, which must be UTF-8.
func (r *wireReader) text() (string, error) {
	b, err := r.bytes()
	if err != nil || !utf8.ValidString(b) {
		return "", errUncovered
	}
	return b, nil
}

func decodeRequest(s string, req *rlsv3.RateLimitRequest) error {
	r := wireReader{s}
	for len(r.s) > 0 {
		num, wire, err := r.field()
		if err != nil {
			return err
		}
		switch {
		case num == 1 && wire == wireBytes:
			if req.Domain, err = r.text(); err != nil {
				return err
			}
		case num == 2 && wire == wireBytes:
			b, err := r.bytes()
			if err != nil {
				return err
			}
			d := &ratelimitv3.RateLimitDescriptor{}
			if err := decodeDescriptor(b, d); err != nil {
				return err
			}
			req.Descriptors = append(req.Descriptors, d)
		case num == 3 && wire == wireVarint:
			v, err := r.varint()
			if err != nil {
				return err
			}
			req.HitsAddend = uint32(v)
		default:
			return errUncovered
		}
	}
	return nil
}

func decodeDescriptor(s string, d *ratelimitv3.RateLimitDescriptor) error {
	r := wireReader{s}
	for len(r.s) > 0 {
		num, wire, err := r.field()
		if err != nil {
			return err
		}
		switch {
		case num == 1 && wire == wireBytes:
			b, err := r.bytes()
			if err != nil {
				return err
			}
			e := &ratelimitv3.RateLimitDescriptor_Entry{}
			if err := decodeEntry(b, e); err != nil {
				return err
			}
			d.Entries = append(d.Entries, e)
		case num == 2 && wire == wireBytes && d.Limit == nil: // a second one merges: the stock codec's
			b, err := r.bytes()
			if err != nil {
				return err
			}
			d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{}
			if err := decodeOverride(b, d.Limit); err != nil {
				return err
			}
		case num == 3 && wire == wireBytes && d.HitsAddend == nil:
			b, err := r.bytes()
			if err != nil {
				return err
			}
			v, err := decodeWrapped(b)
			if err != nil {
				return err
			}
			d.HitsAddend = wrapperspb.UInt64(v)
		case num == 4 && wire == wireVarint:
			v, err := r.varint()
			if err != nil {
				return err
			}
			d.IsNegativeHits = v != 0
		default:
			return errUncovered
		}
	}
	return nil
}

func decodeEntry(s string, e *ratelimitv3.RateLimitDescriptor_Entry) error {
	r := wireReader{s}
	for len(r.s) > 0 {
		num, wire, err := r.field()
		if err != nil {
			return err
		}
		switch {
		case num == 1 && wire == wireBytes:
			e.Key, err = r.text()
		case num == 2 && wire == wireBytes:
			e.Value, err = r.text()
		default:
			return errUncovered
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func decodeOverride(s string, o *ratelimitv3.RateLimitDescriptor_RateLimitOverride) error {
	r := wireReader{s}
	for len(r.s) > 0 {
		num, wire, err := r.field()
		if err != nil {
			return err
		}
		switch {
		case num == 1 && wire == wireVarint:
			v, err := r.varint()
			if err != nil {
				return err
			}
			o.RequestsPerUnit = uint32(v)
		case num == 2 && wire == wireVarint:
			v, err := r.varint()
			if err != nil {
				return err
			}
			o.Unit = typev3.RateLimitUnit(int32(v))
		case num == 3 && wire == wireBytes && o.UnitMultiplier == nil:
			b, err := r.bytes()
			if err != nil {
				return err
			}
			v, err := decodeWrapped(b)
			if err != nil {
				return err
			}
			o.UnitMultiplier = wrapperspb.UInt32(uint32(v))
		default:
			return errUncovered
		}
	}
	return nil
}

// decodeWrapped reads a wrapper message (UInt32Value, UInt64Value): its one
// varint field 1.
func decodeWrapped(s string) (uint64, error) {
	r := wireReader{s}
	var v uint64
	for len(r.s) > 0 {
		num, wire, err := r.field()
		if err != nil || num != 1 || wire != wireVarint {
			return 0, errUncovered
		}
		if v, err = r.varint(); err != nil {
			return 0, err
		}
	}
	return v, nil
}
