// Package clientcheck holds the tests and examples of package
// github.com/sluice-go/sluice/client that run it against a real `sluice
// serve` service (service.Server over loopback HTTP). They live here, in
// the service's module, because the client is in the library's module,
// which must not require the service's: a replica importing the client
// pulls no grpc, Envoy, Redis or plot module.
package clientcheck
