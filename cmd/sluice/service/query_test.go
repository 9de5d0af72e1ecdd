package service

import (
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzParseAllowQuery: never panics, and whenever it accepts a query the
// standard parser agrees on key and n.
func FuzzParseAllowQuery(f *testing.F) {
	for _, s := range []string{"key=t", "key=t&n=3", "n=2&key=a%20b", "key=a+b&x=1", "key=%zz", "key=a&key=b",
		"&&key=&", "n=-1&key=x", "key=" + string(make([]byte, 300)), "k%65y=v", "key=a;b", "n=1e3&key=k"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		var a allowArgs
		err := parseAllowQuery(raw, &a)
		if err != nil {
			return
		}
		std, stdErr := url.ParseQuery(raw)
		if stdErr != nil {
			// The standard parser also refuses ';' and bad escapes in
			// parameters we ignore; we only need agreement where it parses.
			return
		}
		if a.hasKey {
			require.Equal(t, []string{a.key}, std["key"], "query %q", raw)
		} else {
			require.Empty(t, std["key"])
		}
		if a.hasN {
			require.Equal(t, []string{a.nRaw}, std["n"], "query %q", raw)
		}
		if a.validate() == nil {
			require.NotEmpty(t, a.key)
			require.LessOrEqual(t, len(a.key), MaxKeyLen)
			require.GreaterOrEqual(t, a.n, int64(1))
		}
	})
}
