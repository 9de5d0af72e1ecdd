package service_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/httplimit"
	"github.com/sluice-go/sluice/store"
)

func TestParseLimits(t *testing.T) {
	got, err := service.ParseLimits(" tenant-a=100:200 , tenant-b=5:5,c=0.5:1,d=2.5,k=v=1:1")
	require.NoError(t, err)
	assert.Equal(t, map[string]store.Policy{
		"tenant-a": {Name: "tenant-a", Rate: 100, Burst: 200},
		"tenant-b": {Name: "tenant-b", Rate: 5, Burst: 5},
		"c":        {Name: "c", Rate: 0.5, Burst: 1},
		"d":        {Name: "d", Rate: 2.5, Burst: 3},
		"k=v":      {Name: "k=v", Rate: 1, Burst: 1},
	}, got)
	got, err = service.ParseLimits("")
	require.NoError(t, err)
	assert.Empty(t, got)
	got, err = service.ParseLimits(`"q"=1:1`)
	require.NoError(t, err)
	assert.Equal(t, `"q"`, got[`"q"`].Name, "printable ASCII, quotes included, names itself")
	got, err = service.ParseLimits("\u00fcber=1:1")
	require.NoError(t, err)
	assert.Equal(t, "limit-1", got["\u00fcber"].Name, "a key that is not a valid policy name")
}

// TestPolicyNamesOneRule: a policy name httplimit accepts is one the
// service accepts (in Config) and keeps (for a -limits key), and the other
// way round: both check it with the same rule.
func TestPolicyNamesOneRule(t *testing.T) {
	mem := store.NewMemory()
	t.Cleanup(func() { _ = mem.Close() })
	for _, name := range []string{"tenant-a", "2001:db8::/64", "a b", `"q"`, `a\b`, "~", "\u00fcber", "tab\tx", "del\x7f"} {
		t.Run(name, func(t *testing.T) {
			_, mwErr := httplimit.NewMiddleware(mem, store.Policy{Name: name, Rate: 1, Burst: 1})
			_, svcErr := service.New(service.Config{Store: mem, Default: store.Policy{Name: name, Rate: 1, Burst: 1}})
			assert.Equal(t, mwErr == nil, svcErr == nil, "httplimit: %v; service: %v", mwErr, svcErr)
			if svcErr != nil {
				assert.ErrorContains(t, svcErr, "service: default policy: policy name")
			}
			got, err := service.ParseLimits(name + "=1:1")
			require.NoError(t, err, "a key is never refused for its name")
			assert.Equal(t, mwErr == nil, got[name].Name == name, "the key names its policy iff httplimit accepts the name (%v)", mwErr)
		})
	}
}

func TestParseLimitsErrorsNameTheEntry(t *testing.T) {
	for in, want := range map[string]string{
		"a=1:1,b":                         `entry 2 "b": want KEY=RATE:BURST`,
		"a=1:1,,b=1:1":                    `entry 2 "": empty entry`,
		"a=1:1,":                          `entry 2 "": empty entry`,
		"=1:1":                            `entry 1 "=1:1": empty key`,
		"a=x:1":                           `rate "x" is not a number`,
		"a=1:x":                           `burst "x" is not a whole number`,
		"a=1:99999999999999999999":        `burst "99999999999999999999" is out of range`,
		"a=1e999:1":                       `rate "1e999" is out of range`,
		"a=1:1.5":                         `burst "1.5"`,
		"a=0:1":                           `rate 0`,
		"a=-1:1":                          `rate -1`,
		"a=NaN:1":                         `rate NaN`,
		"a=1:0":                           `burst 0`,
		"a=1:1,a=2:2":                     `key "a" is already limited`,
		"a=1e-9:100":                      `over the`,
		strings.Repeat("k", 257) + "=1:1": "257 bytes",
	} {
		_, err := service.ParseLimits(in)
		if assert.Error(t, err, in) {
			assert.Contains(t, err.Error(), want, in)
		}
	}
}

// FuzzParseLimits: never panics; whatever it accepts is usable.
func FuzzParseLimits(f *testing.F) {
	for _, s := range []string{"", "a=1:1", "tenant-a=100:200,tenant-b=5:5", "a=0.5", "a=1:1,", "=", "a=1e308:1", "a=1:9223372036854775807", "a==1:1", " , "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		limits, err := service.ParseLimits(s)
		if err != nil {
			assert.Contains(t, err.Error(), "-limits entry")
			return
		}
		for k, p := range limits {
			require.NotEmpty(t, k)
			require.LessOrEqual(t, len(k), service.MaxKeyLen)
			require.NoError(t, p.Validate(), "key %q", k)
			require.NotEmpty(t, p.Name)
		}
	})
}
