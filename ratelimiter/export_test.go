package ratelimiter

// Dropped returns the tokens l's bucket could not hold and dropped: what
// came back from a waiter that left without its tokens, or from a grant
// handed back, beyond the bucket's burst (see Limiter).
func Dropped(l *Limiter) float64 { return l.dropped() }
