package lease

// The wire messages: one Request renews every key a replica holds, and the
// Response answers each key in the same order. The JSON field names are the
// protocol (docs/leases.md describes each field); a server can decode a
// Request and encode a Response as they are, over HTTP or any transport.
//
// Durations travel as whole milliseconds relative to the moment the server
// handled the request, never as wall-clock instants: a replica measures its
// lease from the moment it sent the request, on its own monotonic clock, so
// an offset between the hosts' clocks does not matter, only the difference
// in their rates (see Options.DriftMargin).

// Request is one replica's renewal of all its keys.
type Request struct {
	// Holder names the replica: unique per process, stable for its life.
	Holder string `json:"holder"`
	// Keys are the keys the replica asks for, renews or gives back.
	Keys []KeyRequest `json:"keys"`
}

// KeyRequest is the replica's state and demand for one key.
type KeyRequest struct {
	Policy string `json:"policy"`
	Key    string `json:"key"`
	// Token is the lease's token from an earlier Grant, empty to ask for a
	// new lease. Only the holder that knows it renews or gives back.
	Token string `json:"token,omitempty"`
	// Seq is the grant the replica enforces now (Grant.Seq), 0 for none.
	// When it is the latest grant the server sent, it acknowledges that
	// grant: every other grant is then out of force, and what a smaller
	// share freed can go to others.
	Seq uint64 `json:"seq,omitempty"`
	// HaveRate and HaveBurst are the share the replica enforces under Seq:
	// at most that grant's, less when the replica lowered its own share
	// (it wants less), which frees the difference at once.
	HaveRate  float64 `json:"have_rate,omitempty"`
	HaveBurst int64   `json:"have_burst,omitempty"`
	// Want is the rate, in tokens a second, the replica would use: its
	// declared demand or the rate it admitted since its last renewal.
	Want float64 `json:"want"`
	// Waiting reports that callers were refused or waited since the last
	// renewal: the replica would use more than Want, how much is unknown.
	Waiting bool `json:"waiting,omitempty"`
	// Release gives the lease back: the replica enforces nothing from now
	// on (it has capped itself at zero before sending).
	Release bool `json:"release,omitempty"`
}

// Response answers a Request, one Grant per KeyRequest in the same order.
type Response struct {
	Keys []Grant `json:"keys"`
	// RefreshMS is when the replica should renew next, in milliseconds.
	RefreshMS int64 `json:"refresh_ms"`
}

// Grant is the server's answer for one key: a share and how long it is
// good for, or an error.
type Grant struct {
	Policy string `json:"policy"`
	Key    string `json:"key"`
	// Token identifies the lease; the replica sends it back to renew.
	Token string `json:"token,omitempty"`
	// Seq numbers the grants of one lease, increasing; a replica applies a
	// grant only if its Seq is above the one it enforces.
	Seq uint64 `json:"seq,omitempty"`
	// Rate (tokens a second) and Burst (tokens) are the replica's share.
	Rate  float64 `json:"rate"`
	Burst int64   `json:"burst"`
	// ExpiresMS is how long the share is good for, from when the server
	// handled the request. The replica counts it from when it sent the
	// request, less its drift margin.
	ExpiresMS int64 `json:"expires_ms"`
	// LimitRate and LimitBurst are the policy's: the whole capacity shared
	// by every holder of the key.
	LimitRate  float64 `json:"limit_rate"`
	LimitBurst int64   `json:"limit_burst"`
	// Error is a code naming why the key was refused (empty when granted):
	// see Code; Message says it in words.
	Error   string `json:"error,omitempty"`
	Message string `json:"message,omitempty"`
}
