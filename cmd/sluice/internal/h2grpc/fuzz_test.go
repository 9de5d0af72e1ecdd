package h2grpc_test

import (
	"bytes"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"

	"github.com/sluice-go/sluice/cmd/sluice/internal/h2grpc"
)

// fuzzDesc is the test service without its blocking and allocating
// methods: what the fuzzer reaches must end by itself.
var fuzzDesc = grpc.ServiceDesc{ServiceName: testDesc.ServiceName, HandlerType: testDesc.HandlerType,
	Methods: []grpc.MethodDesc{testDesc.Methods[0], testDesc.Methods[1], testDesc.Methods[4]}, Streams: testDesc.Streams}

// fuzzBlock is a header block of a call to path that leaves the HPACK
// dynamic table alone (every field never indexed), so that blocks encoded
// apart can follow each other on one connection.
func fuzzBlock(path string, extra ...hpack.HeaderField) []byte {
	var b bytes.Buffer
	enc := hpack.NewEncoder(&b)
	for _, f := range append([]hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: path},
		{Name: ":authority", Value: "sluice"}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
	}, extra...) {
		f.Sensitive = true
		_ = enc.WriteField(f)
	}
	return b.Bytes()
}

// fuzzFrames is frames written by write.
func fuzzFrames(write func(fr *http2.Framer)) []byte {
	var b bytes.Buffer
	fr := http2.NewFramer(&b, nil)
	fr.AllowIllegalWrites = true
	write(fr)
	return b.Bytes()
}

// fuzzPrefix is what a client sends before the fuzzed bytes: its preface
// and SETTINGS and, when mode's low bit is 0, a first call on stream 1
// (so the connection is h2grpc's, and the fuzzed bytes reach conn.go and
// call.go rather than the sniff).
func fuzzPrefix(mode byte) []byte {
	b := []byte(http2.ClientPreface)
	return append(b, fuzzFrames(func(fr *http2.Framer) {
		_ = fr.WriteSettings()
		if mode&1 == 0 {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: fuzzBlock(echoPath), EndHeaders: true})
			_ = fr.WriteData(1, true, msg("first"))
		}
	})...)
}

func fuzzSeeds() [][]byte {
	block := fuzzBlock(echoPath)
	seeds := [][]byte{
		fuzzFrames(func(fr *http2.Framer) { // a second call
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: block, EndHeaders: true})
			_ = fr.WriteData(3, true, msg("second"))
		}),
		fuzzFrames(func(fr *http2.Framer) { // padded and prioritized
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: block, EndHeaders: true, PadLength: 7,
				Priority: http2.PriorityParam{StreamDep: 1, Weight: 9}})
			_ = fr.WriteDataPadded(3, true, msg("padded"), make([]byte, 20))
		}),
		fuzzFrames(func(fr *http2.Framer) { // a header block in pieces
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: block[:5]})
			_ = fr.WriteContinuation(3, false, block[5:9])
			_ = fr.WriteContinuation(3, true, block[9:])
			_ = fr.WriteData(3, false, msg("cont")[:3])
			_ = fr.WriteData(3, true, msg("cont")[3:])
		}),
		fuzzFrames(func(fr *http2.Framer) { // trailers of the client
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: block, EndHeaders: true})
			_ = fr.WriteData(3, false, msg("trailers"))
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: fuzzBlock(failPath)[:0], EndHeaders: true, EndStream: true})
		}),
		fuzzFrames(func(fr *http2.Framer) {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: fuzzBlock(failPath), EndHeaders: true})
			_ = fr.WriteData(3, true, msg("100% ✓"))
		}),
		fuzzFrames(func(fr *http2.Framer) {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: fuzzBlock(echoPath,
				hpack.HeaderField{Name: "grpc-timeout", Value: "1m"}, hpack.HeaderField{Name: "grpc-encoding", Value: "gzip"}), EndHeaders: true})
		}),
		fuzzFrames(func(fr *http2.Framer) {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: fuzzBlock(streamPath), EndHeaders: true})
		}),
		fuzzFrames(func(fr *http2.Framer) { _ = fr.WritePriority(3, http2.PriorityParam{StreamDep: 1, Weight: 3}) }),
		fuzzFrames(func(fr *http2.Framer) {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: block, EndHeaders: true})
			_ = fr.WriteRSTStream(3, http2.ErrCodeCancel)
		}),
		fuzzFrames(func(fr *http2.Framer) {
			_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 0}, http2.Setting{ID: http2.SettingMaxFrameSize, Val: 20000})
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: block, EndHeaders: true})
			_ = fr.WriteData(3, true, msg("windowless"))
			_ = fr.WriteWindowUpdate(3, 5)
			_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1000})
		}),
		fuzzFrames(func(fr *http2.Framer) { _ = fr.WriteSettingsAck() }),
		fuzzFrames(func(fr *http2.Framer) {
			_ = fr.WritePushPromise(http2.PushPromiseParam{StreamID: 1, PromiseID: 2, BlockFragment: block, EndHeaders: true})
		}),
		fuzzFrames(func(fr *http2.Framer) { _ = fr.WritePing(false, [8]byte{1}); _ = fr.WritePing(true, [8]byte{2}) }),
		fuzzFrames(func(fr *http2.Framer) { _ = fr.WriteGoAway(1, http2.ErrCodeNo, []byte("bye")) }),
		fuzzFrames(func(fr *http2.Framer) { _ = fr.WriteWindowUpdate(0, 1<<20); _ = fr.WriteWindowUpdate(1, 1) }),
		fuzzFrames(func(fr *http2.Framer) { _ = fr.WriteContinuation(1, true, block) }),
		fuzzFrames(func(fr *http2.Framer) { _ = fr.WriteRawFrame(0xfa, 0xff, 3, []byte("unknown")) }),
		fuzzFrames(func(fr *http2.Framer) { _ = fr.WriteData(9, true, []byte{1, 0, 0, 0, 2, 'h', 'i'}) }),
	}
	return seeds
}

// FuzzConn feeds a connection arbitrary bytes after a valid preface (and,
// per the first byte's low bit, a first call): the server must not panic,
// and must end the connection once the client closes it, all within a
// deadline.
func FuzzConn(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(append([]byte{0}, s...))
		f.Add(append([]byte{1}, fuzzFrames(func(fr *http2.Framer) {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: fuzzBlock(echoPath), EndHeaders: true})
			_ = fr.WriteData(1, true, msg("first"))
		})...))
		f.Add(append([]byte{1}, s...))
	}
	svc := newTestService()
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		srv := h2grpc.New(h2grpc.Config{MaxStreams: 8, RecvTimeout: 200 * time.Millisecond, IdleTimeout: time.Second,
			MaxRequestBytes: 4096, Log: discardLog()}, 1)
		srv.RegisterService(&fuzzDesc, svc)
		cli, sc := net.Pipe()
		served := make(chan struct{})
		go func() { srv.ServeConn(sc); close(served) }()
		drained := make(chan struct{})
		go func() { _, _ = io.Copy(io.Discard, cli); close(drained) }()
		_ = cli.SetWriteDeadline(time.Now().Add(2 * time.Second))
		if _, err := cli.Write(fuzzPrefix(data[0])); err == nil {
			_, _ = cli.Write(data[1:])
		}
		cli.Close()
		select {
		case <-served:
		case <-time.After(5 * time.Second):
			buf := make([]byte, 1<<20)
			t.Fatalf("ServeConn did not return 5 s after the client closed:\n%s", buf[:runtime.Stack(buf, true)])
		}
		srv.Close()
		<-drained
	})
}
