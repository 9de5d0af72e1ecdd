package store

import "fmt"

// FailMode is what a limit answers while whatever decides it cannot: a
// store that fails (httplimit's Middleware, `sluice serve -fail`), a
// service out of reach (package client), a lease past its expiry
// unrenewed (package lease), a shared table's slot under contention beyond
// its retry bound (package sharedbucket). Every package that has a fail
// mode takes this one type.
//
// The zero FailMode is the default of whatever takes it, which each
// documents: FailOpen everywhere but package lease, whose point is a
// global bound and which fails closed.
type FailMode uint8

const (
	// FailOpen allows: the work goes on, unlimited while the failure
	// lasts. It protects the caller's availability.
	FailOpen FailMode = iota + 1
	// FailClosed denies: no work goes on while the failure lasts. It
	// protects what the limit guards (logins, a fragile upstream).
	FailClosed
)

// String returns "open", "closed", or "default" for the zero FailMode.
func (m FailMode) String() string {
	switch m {
	case FailOpen:
		return "open"
	case FailClosed:
		return "closed"
	case 0:
		return "default"
	}
	return fmt.Sprintf("FailMode(%d)", uint8(m))
}

// ParseFailMode parses "open" or "closed", the words of the -fail flags.
func ParseFailMode(s string) (FailMode, error) {
	switch s {
	case "open":
		return FailOpen, nil
	case "closed":
		return FailClosed, nil
	}
	return 0, fmt.Errorf("fail mode %q: want open or closed", s)
}
