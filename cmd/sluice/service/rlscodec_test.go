package service_test

import (
	"context"
	"math"
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-go/sluice/cmd/sluice/service"
)

// randText is a short string, sometimes empty, sometimes not ASCII.
func randText(r *rand.Rand) string {
	const alphabet = "ab=|%*é€😀"
	s := []rune(alphabet)
	b := make([]rune, r.IntN(6))
	for i := range b {
		b[i] = s[r.IntN(len(s))]
	}
	return string(b)
}

// randUint32 is 0, 1, a boundary or anything.
func randUint32(r *rand.Rand) uint32 {
	switch r.IntN(4) {
	case 0:
		return 0
	case 1:
		return 1
	case 2:
		return math.MaxUint32
	}
	return r.Uint32()
}

func randRequest(r *rand.Rand) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: randText(r), HitsAddend: randUint32(r)}
	for range r.IntN(4) {
		d := &ratelimitv3.RateLimitDescriptor{IsNegativeHits: r.IntN(4) == 0}
		for range r.IntN(4) {
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: randText(r), Value: randText(r)})
		}
		if r.IntN(2) == 0 {
			d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{
				RequestsPerUnit: randUint32(r), Unit: typev3.RateLimitUnit(r.IntN(9) - 1)}
			if r.IntN(2) == 0 {
				d.Limit.UnitMultiplier = wrapperspb.UInt32(randUint32(r))
			}
		}
		if r.IntN(2) == 0 {
			d.HitsAddend = wrapperspb.UInt64([]uint64{0, 1, math.MaxUint64, r.Uint64()}[r.IntN(4)])
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	return req
}

func randResponse(r *rand.Rand) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_Code(r.IntN(4) - 1)}
	for range r.IntN(4) {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{
			Code: rlsv3.RateLimitResponse_Code(r.IntN(4) - 1), LimitRemaining: randUint32(r)}
		if r.IntN(2) == 0 {
			st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: randText(r), RequestsPerUnit: randUint32(r),
				Unit: rlsv3.RateLimitResponse_RateLimit_Unit(r.IntN(9) - 1)}
			if r.IntN(2) == 0 {
				st.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(randUint32(r))
			}
		}
		if r.IntN(2) == 0 {
			st.DurationUntilReset = durationpb.New(time.Duration(r.Int64N(1<<40) - 1<<38))
			if r.IntN(8) == 0 {
				st.DurationUntilReset = &durationpb.Duration{Seconds: r.Int64(), Nanos: r.Int32() - 1<<30}
			}
		}
		resp.Statuses = append(resp.Statuses, st)
	}
	return resp
}

func bufs(b []byte) mem.BufferSlice { return mem.BufferSlice{mem.SliceBuffer(b)} }

// stockUnmarshal decodes b as grpc-go's own codec does.
func stockUnmarshal(b []byte) (*rlsv3.RateLimitRequest, error) {
	var req rlsv3.RateLimitRequest
	err := encoding.GetCodecV2("proto").Unmarshal(bufs(b), &req)
	return &req, err
}

// requireSameDecode checks that RateLimitCodec decodes b exactly as the
// stock codec does: the same message, or an error where it errs.
func requireSameDecode(t testing.TB, b []byte) {
	want, wantErr := stockUnmarshal(b)
	var got rlsv3.RateLimitRequest
	err := service.RateLimitCodec().Unmarshal(bufs(b), &got)
	if wantErr != nil {
		require.Error(t, err, "% x", b)
		return
	}
	require.NoError(t, err, "% x", b)
	require.True(t, proto.Equal(want, &got), "% x: got %v, want %v", b, &got, want)
}

// TestRateLimitCodecRequestsAsStock: random requests, as Envoy's protobuf
// writes them, then cut short or with a byte changed, decode as the stock
// codec decodes them.
func TestRateLimitCodecRequestsAsStock(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 5000 {
		b, err := proto.Marshal(randRequest(r))
		require.NoError(t, err)
		requireSameDecode(t, b)
		if len(b) > 0 {
			requireSameDecode(t, b[:r.IntN(len(b))])
			c := append([]byte(nil), b...)
			c[r.IntN(len(c))] ^= byte(1 + r.IntN(255))
			requireSameDecode(t, c)
		}
	}
}

// TestRateLimitCodecRequestsUncommon: what the hand-written decoder hands
// to the stock one still decodes as it does: unknown fields, a field on
// another wire type, a singular message twice (merged), a scalar twice
// (the last wins), invalid UTF-8, a message split across buffers.
func TestRateLimitCodecRequestsUncommon(t *testing.T) {
	entry := protowire.AppendTag(nil, 1, protowire.BytesType)
	entry = protowire.AppendString(entry, "k")
	desc := protowire.AppendTag(nil, 1, protowire.BytesType)
	desc = protowire.AppendBytes(desc, entry)
	base := protowire.AppendTag(nil, 1, protowire.BytesType)
	base = protowire.AppendString(base, "d")
	base = protowire.AppendTag(base, 2, protowire.BytesType)
	base = protowire.AppendBytes(base, desc)

	limit := func(rpu uint64) []byte {
		o := protowire.AppendTag(nil, 1, protowire.VarintType)
		o = protowire.AppendVarint(o, rpu)
		d := append([]byte(nil), desc...)
		d = protowire.AppendTag(d, 2, protowire.BytesType)
		return protowire.AppendBytes(d, o)
	}
	twoLimits := append(limit(5), limit(7)[len(desc):]...)
	cases := map[string][]byte{
		"plain":          base,
		"unknown field":  protowire.AppendVarint(protowire.AppendTag(append([]byte(nil), base...), 99, protowire.VarintType), 1),
		"wire type":      protowire.AppendFixed32(protowire.AppendTag(append([]byte(nil), base...), 3, protowire.Fixed32Type), 1),
		"limit twice":    protowire.AppendBytes(protowire.AppendTag(append([]byte(nil), base[:3]...), 2, protowire.BytesType), twoLimits),
		"hits twice":     protowire.AppendVarint(protowire.AppendTag(protowire.AppendVarint(protowire.AppendTag(append([]byte(nil), base...), 3, protowire.VarintType), 4), 3, protowire.VarintType), 9),
		"bad UTF-8":      protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "\xff"),
		"varint 10":      protowire.AppendVarint(protowire.AppendTag(append([]byte(nil), base...), 3, protowire.VarintType), math.MaxUint64),
		"varint too big": append(protowire.AppendTag(append([]byte(nil), base...), 3, protowire.VarintType), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02),
		"field 0":        {0x00, 0x00},
		"empty":          {},
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) { requireSameDecode(t, b) })
	}
	// A message split across buffers, as grpc-go hands over a large one.
	b, err := proto.Marshal(randRequest(rand.New(rand.NewPCG(3, 4))))
	require.NoError(t, err)
	var got rlsv3.RateLimitRequest
	require.NoError(t, service.RateLimitCodec().Unmarshal(mem.BufferSlice{mem.SliceBuffer(b[:len(b)/2]), mem.SliceBuffer(b[len(b)/2:])}, &got))
	want, err := stockUnmarshal(b)
	require.NoError(t, err)
	require.True(t, proto.Equal(want, &got))
}

// TestRateLimitCodecResponsesAsStock: random responses encode to the stock
// codec's bytes; one with a field the hand-written path does not write
// goes to the stock codec whole.
func TestRateLimitCodecResponsesAsStock(t *testing.T) {
	c, stock := service.RateLimitCodec(), encoding.GetCodecV2("proto")
	r := rand.New(rand.NewPCG(5, 6))
	for range 5000 {
		resp := randResponse(r)
		if r.IntN(16) == 0 {
			switch r.IntN(3) {
			case 0:
				resp.ResponseHeadersToAdd = []*corev3.HeaderValue{{Key: "x", Value: "y"}}
			case 1:
				resp.RawBody = []byte("body")
			case 2:
				resp.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 1))
			}
		}
		got, err := c.Marshal(resp)
		require.NoError(t, err)
		want, err := stock.Marshal(resp)
		require.NoError(t, err)
		require.Equal(t, want.Materialize(), got.Materialize(), "%v", resp)
	}
}

// TestRateLimitCodecOverGRPC: a server with RateLimitCodec, called by
// go-control-plane's generated client on grpc-go's stock codec, receives
// each random request as sent, and the client decodes each random response
// as the server built it.
func TestRateLimitCodecOverGRPC(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &echoRLS{}
	g := grpc.NewServer(grpc.ForceServerCodecV2(service.RateLimitCodec()))
	rlsv3.RegisterRateLimitServiceServer(g, srv)
	done := make(chan struct{})
	go func() { _ = g.Serve(ln); close(done) }()
	defer func() { g.Stop(); <-done }()

	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer cc.Close()
	client := rlsv3.NewRateLimitServiceClient(cc)
	r := rand.New(rand.NewPCG(7, 8))
	for i := range 2000 {
		req := randRequest(r)
		req.Domain = strconv.Itoa(i) // the server's seed for its answer
		got, err := client.ShouldRateLimit(context.Background(), req)
		require.NoError(t, err)
		assert.True(t, proto.Equal(req, srv.last), "server got %v, want %v", srv.last, req)
		want := randResponse(rand.New(rand.NewPCG(uint64(i), 9)))
		require.True(t, proto.Equal(want, got), "client got %v, want %v", got, want)
	}
}

// echoRLS keeps the last request and answers a random response seeded by
// the request's domain.
type echoRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	last *rlsv3.RateLimitRequest
}

func (e *echoRLS) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	e.last = req
	seed, _ := strconv.ParseUint(req.Domain, 10, 64)
	return randResponse(rand.New(rand.NewPCG(seed, 9))), nil
}

// FuzzRateLimitCodecRequest: any bytes decode as the stock codec decodes
// them.
func FuzzRateLimitCodecRequest(f *testing.F) {
	r := rand.New(rand.NewPCG(10, 11))
	for range 16 {
		b, err := proto.Marshal(randRequest(r))
		require.NoError(f, err)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) { requireSameDecode(t, b) })
}

func BenchmarkRateLimitCodec(b *testing.B) {
	req := &rlsv3.RateLimitRequest{Domain: "perf", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "k1001"}}}}}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK,
			CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 1000, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND},
			LimitRemaining:     999,
			DurationUntilReset: durationpb.New(time.Millisecond)}}}
	in, err := proto.Marshal(req)
	require.NoError(b, err)
	for _, c := range []struct {
		name  string
		codec encoding.CodecV2
	}{{"stock", encoding.GetCodecV2("proto")}, {"rls", service.RateLimitCodec()}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var r rlsv3.RateLimitRequest
				if err := c.codec.Unmarshal(bufs(in), &r); err != nil {
					b.Fatal(err)
				}
				out, err := c.codec.Marshal(resp)
				if err != nil {
					b.Fatal(err)
				}
				out.Free()
			}
		})
	}
}
