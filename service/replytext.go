package service

// replyText gathers the variable text of one response, its header values
// and its body, in a buffer the caller keeps on its stack, and hands the
// parts out as substrings of one string: two allocations per response (the
// string, and the []string the header values share) instead of one or two
// per value. Header values become vals[i:i+1:i+1] (capped, so nobody's
// append can reach a neighbour); the body is written with io.WriteString,
// which net/http's ResponseWriter takes without a copy to []byte.
//
//	var arr [256]byte
//	t := replyText{buf: arr[:0]}
//	t.buf = strconv.AppendInt(t.buf, n, 10)
//	remaining := t.end()
//	...
//	vals := t.strings()
//	h["X-Ratelimit-Remaining"] = vals[remaining : remaining+1 : remaining+1]
//
// The zero value is ready to use (with a buffer of its own on the heap).
type replyText struct {
	buf  []byte
	ends [replyParts]int
	n    int
}

const replyParts = 6 // the most parts one response has

// end closes the part written since the previous end and returns its index.
// It panics after replyParts parts: a programming error.
func (t *replyText) end() int {
	t.ends[t.n] = len(t.buf)
	t.n++
	return t.n - 1
}

// strings returns the parts, in order, as substrings of one string.
func (t *replyText) strings() []string {
	s := string(t.buf)
	vals := make([]string, t.n)
	start := 0
	for i, end := range t.ends[:t.n] {
		vals[i] = s[start:end]
		start = end
	}
	return vals
}
