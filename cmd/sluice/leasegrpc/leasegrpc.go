// Package leasegrpc carries capacity leases (package lease) over gRPC:
// the service sluice.lease.v1.Leases with one method, Renew, beside Envoy's
// rate-limit service on `sluice serve -grpc`. Its messages are lease.Request
// and lease.Response as JSON (content type application/grpc+json), the same
// documents POST /lease takes and answers, so no protobuf schema is needed
// and the fields are documented once (docs/leases.md).
package leasegrpc

import (
	"context"
	"encoding/json"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"

	"github.com/sluice-go/sluice/lease"
)

// Names of the service and its method, as a gRPC client addresses them.
const (
	ServiceName = "sluice.lease.v1.Leases"
	RenewMethod = "/" + ServiceName + "/Renew"
)

// codec is gRPC's "json" content subtype: messages as encoding/json
// documents.
type codec struct{}

func (codec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (codec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
func (codec) Name() string                       { return "json" }

func init() { encoding.RegisterCodec(codec{}) }

// Renewer answers one lease request (service.Server's allocator).
type Renewer func(ctx context.Context, req *lease.Request) (*lease.Response, error)

// Register serves the Leases service on g, answering with renew. A request
// renew refuses as a whole comes back with InvalidArgument
// (ResourceExhausted for too many keys) and the lease code in its message
// ("too_many_keys: …"), which Transport maps back to the lease error; an
// error that is a gRPC status already (PermissionDenied) goes as it is.
func Register(g grpc.ServiceRegistrar, renew Renewer) {
	g.RegisterService(&grpc.ServiceDesc{
		ServiceName: ServiceName,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Renew",
			Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
				var req lease.Request
				if err := dec(&req); err != nil {
					return nil, status.Errorf(codes.InvalidArgument, "bad_request: %v", err)
				}
				resp, err := renew(ctx, &req)
				if _, ok := status.FromError(err); ok && err != nil {
					return nil, err // a gRPC status already (PermissionDenied): as it is
				}
				if err != nil {
					c := codes.InvalidArgument
					if lease.Code(err) == "too_many_keys" {
						c = codes.ResourceExhausted
					}
					return nil, status.Errorf(c, "%s: %v", lease.Code(err), err)
				}
				return resp, nil
			},
		}},
		Metadata: "sluice/lease/v1",
	}, struct{}{})
}

// Transport renews over cc, a connection to `sluice serve -grpc`.
func Transport(cc grpc.ClientConnInterface) lease.Transport {
	return lease.TransportFunc(func(ctx context.Context, req *lease.Request) (*lease.Response, error) {
		var resp lease.Response
		if err := cc.Invoke(ctx, RenewMethod, req, &resp, grpc.CallContentSubtype("json")); err != nil {
			if st, ok := status.FromError(err); ok && (st.Code() == codes.InvalidArgument || st.Code() == codes.ResourceExhausted) {
				if code, msg, ok := cutCode(st.Message()); ok {
					return nil, lease.Err(code, msg)
				}
			}
			return nil, err
		}
		if len(resp.Keys) != len(req.Keys) {
			return nil, fmt.Errorf("leasegrpc: the server answered %d keys for %d", len(resp.Keys), len(req.Keys))
		}
		return &resp, nil
	})
}

// cutCode splits "code: message".
func cutCode(s string) (code, msg string, ok bool) {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == ':' {
			return s[:i], s, i > 0
		}
		if !(c == '_' || 'a' <= c && c <= 'z') {
			return "", "", false
		}
	}
	return "", "", false
}
