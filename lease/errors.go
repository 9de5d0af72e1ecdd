package lease

import "errors"

// Conditions a server refuses, as errors a caller can tell apart with
// errors.Is. On the wire each travels as its Code in Grant.Error (or, for a
// whole request, in the transport's error body); Err maps a code back.
var (
	// ErrBadRequest: a request a server cannot read (no holder, an empty
	// policy or key, a key twice in one request, a name too long).
	ErrBadRequest = errors.New("lease: bad request")
	// ErrBadDemand: a demand or share that is not a finite number ≥ 0.
	ErrBadDemand = errors.New("lease: bad demand")
	// ErrUnknownPolicy: the server has no such policy.
	ErrUnknownPolicy = errors.New("lease: unknown policy")
	// ErrTooManyKeys: more keys in one request than the server takes.
	ErrTooManyKeys = errors.New("lease: too many keys in one request")
	// ErrTooManyHolders: the key's lease table (or the server's) is full.
	ErrTooManyHolders = errors.New("lease: too many holders")
	// ErrNotHeld: renewing or giving back a lease the holder does not hold
	// (a wrong token, or another process under the same holder name).
	ErrNotHeld = errors.New("lease: lease not held")
)

var codes = []struct {
	code string
	err  error
}{
	{"bad_request", ErrBadRequest},
	{"bad_demand", ErrBadDemand},
	{"unknown_policy", ErrUnknownPolicy},
	{"too_many_keys", ErrTooManyKeys},
	{"too_many_holders", ErrTooManyHolders},
	{"not_held", ErrNotHeld},
}

// Code returns the wire code of err (one of the errors above, possibly
// wrapped), or "error" for any other.
func Code(err error) string {
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return "error"
}

// Err returns the error of a wire code ("" is nil); an unknown code is an
// error naming it.
func Err(code, message string) error {
	if code == "" {
		return nil
	}
	for _, c := range codes {
		if c.code == code {
			if message == "" {
				return c.err
			}
			return &codeError{c.err, message}
		}
	}
	return &codeError{errors.New("lease: " + code), message}
}

// codeError is a refusal from the wire: the server's message, matching its
// sentinel.
type codeError struct {
	err error
	msg string
}

func (e *codeError) Error() string {
	if e.msg == "" {
		return e.err.Error()
	}
	return e.msg
}
func (e *codeError) Unwrap() error { return e.err }

func errorsIsNotHeld(err error) bool { return errors.Is(err, ErrNotHeld) }
