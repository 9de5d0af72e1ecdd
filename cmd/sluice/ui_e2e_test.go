package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/internal/redistest"
)

// chromium returns the path of a headless-capable Chromium, or skips the
// test saying so (and fails when SLUICE_REQUIRE_CHROMIUM is set, as .ci/run
// does).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("SLUICE_REQUIRE_CHROMIUM") != "" {
		t.Fatal("chromium not found on PATH and SLUICE_REQUIRE_CHROMIUM is set (Debian: apt-get install chromium)")
	}
	t.Skip("SKIP: chromium not found on PATH, so /ui is not tested in a browser (Debian: apt-get install chromium; set SLUICE_REQUIRE_CHROMIUM=1 to make this a failure)")
	return ""
}

// headless runs Chromium on url with args (--dump-dom, --screenshot=…)
// and returns its standard output. Each run has a new, empty profile, no
// network beyond the page, and virtual time: timers (the page's one-second
// poll) run at once while the fetches they start are real.
func headless(t *testing.T, bin, url string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + t.TempDir(), "--window-size=1400,1000", "--virtual-time-budget=5000"}
	cmd := exec.CommandContext(ctx, bin, append(append(base, args...), url)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "chromium: %s", stderr.String())
	return stdout.Bytes()
}

// uiTraffic starts a serve with a rule, -limits and a default policy that
// never refills during the test (so every count is exact) and sends it
// known traffic: mallory denied 40 times, eve 25, bob 10; tenant-a
// (-limits) 15; the rule's api-1 denied 3 times.
func uiTraffic(t *testing.T, extra ...string) *server {
	t.Helper()
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(rules, []byte("domain: http\ndescriptors:\n  - key: key\n    value: api-*\n    rate_limit: {unit: hour, requests_per_unit: 20}\n"), 0o600))
	s := serve(t, append([]string{"-store", "memory", "-rate", "0.001", "-burst", "10", "-limits", "tenant-a=0.001:5", "-config", rules}, extra...)...)
	send := func(key string, n int) {
		for range n {
			r := get(t, s.URL+"/allow?key="+key)
			require.Contains(t, []int{200, 429}, r.status, r.body)
		}
	}
	send("bob", 10+10)
	send("mallory", 10+40)
	send("eve", 10+25)
	send("tenant-a", 5+15)
	send("api-1", 20+3)
	return s
}

// policyRow returns the page's table row of policy name.
func policyRow(t *testing.T, page, name string) string {
	t.Helper()
	i := strings.Index(page, `data-policy="`+name+`"`)
	require.GreaterOrEqual(t, i, 0, "policy %q not on the page", name)
	row := page[i:]
	if j := strings.Index(row, "</tr>"); j >= 0 {
		row = row[:j]
	}
	return row
}

var keyRE = regexp.MustCompile(`<span title="([^"]*)">`)

// topKeys returns the keys of a row's list (class top-minute or
// top-quarter), in the order shown.
func topKeys(row, class string) []string {
	i := strings.Index(row, `class="keys `+class+`"`)
	if i < 0 {
		return nil
	}
	l := row[i:]
	l = l[:strings.Index(l, "</ol>")]
	var out []string
	for _, m := range keyRE.FindAllStringSubmatch(l, -1) {
		out = append(out, m[1])
	}
	return out
}

// TestUIInBrowser loads /ui in headless Chromium after known traffic and
// checks what the browser shows once the page's script has fetched the
// live figures: each policy with its counts, and the denied keys, most
// denied first. It keeps a screenshot (in $SLUICE_UI_ARTIFACTS when set,
// else in the test's temporary directory, logged).
func TestUIInBrowser(t *testing.T) {
	bin := chromium(t)
	s := uiTraffic(t)

	dom := string(headless(t, bin, s.URL+"/ui", "--dump-dom"))
	m := regexp.MustCompile(`<body data-updates="(\d+)"`).FindStringSubmatch(dom)
	require.NotNil(t, m, "no body in the DOM:\n%s", dom)
	assert.NotEqual(t, "0", m[1], "the script fetched and showed the live figures")
	assert.Contains(t, dom, "live: updated")

	def := policyRow(t, dom, "default")
	assert.Equal(t, []string{"mallory", "eve", "bob"}, topKeys(def, "top-minute"))
	assert.Equal(t, []string{"mallory", "eve", "bob"}, topKeys(def, "top-quarter"))
	assert.Contains(t, def, "30 total", "allowed")
	assert.Contains(t, def, "75 total", "denied")
	ta := policyRow(t, dom, "tenant-a")
	assert.Equal(t, []string{"tenant-a"}, topKeys(ta, "top-minute"))
	assert.Contains(t, ta, "15 total")
	rule := policyRow(t, dom, "http.key_api-*")
	assert.Contains(t, rule, "key=api-*")
	assert.Contains(t, rule, "20/hour")
	assert.Equal(t, []string{"allow:http|key=api-1|20/hour"}, topKeys(rule, "top-minute"))
	assert.Contains(t, dom, "rules.yaml")

	dir := os.Getenv("SLUICE_UI_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	shot := filepath.Join(dir, "sluice-ui.png")
	headless(t, bin, s.URL+"/ui", "--screenshot="+shot, "--hide-scrollbars")
	png, err := os.ReadFile(shot)
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")), "a PNG")
	assert.Greater(t, len(png), 10_000, "more than a blank page")
	t.Logf("screenshot: %s", shot)
	assert.Equal(t, 0, s.stop(t))
}

// TestUIWithoutJavaScript: a plain GET of /ui (no script runs) shows the
// same figures, rendered by the server, and says the page is static.
func TestUIWithoutJavaScript(t *testing.T) {
	s := uiTraffic(t)
	r := get(t, s.URL+"/ui")
	require.Equal(t, 200, r.status)
	assert.Contains(t, r.header.Get("Content-Type"), "text/html")
	page := r.body
	assert.Contains(t, page, "JavaScript off")
	def := policyRow(t, page, "default")
	assert.Equal(t, []string{"mallory", "eve", "bob"}, topKeys(def, "top-minute"))
	assert.Contains(t, def, "75 total")
	assert.Equal(t, []string{"tenant-a"}, topKeys(policyRow(t, page, "tenant-a"), "top-minute"))
	for _, ext := range []string{`src="http`, `href="http`, "@import", "url("} {
		assert.NotContains(t, page, ext, "nothing is fetched from elsewhere")
	}

	var data struct {
		Policies []struct {
			Name        string `json:"name"`
			DeniedTotal int    `json:"denied_total"`
		} `json:"policies"`
		Sampler bool `json:"sampler"`
	}
	require.NoError(t, json.Unmarshal([]byte(get(t, s.URL+"/ui/data").body), &data))
	assert.True(t, data.Sampler, "serve runs the sampler")
	got := map[string]int{}
	for _, p := range data.Policies {
		got[p.Name] = p.DeniedTotal
	}
	assert.Equal(t, map[string]int{"default": 75, "tenant-a": 15, "http.key_api-*": 3}, got)
	assert.Equal(t, 0, s.stop(t))
}

// TestUIKeysHidden: with -ui-keys=false no key appears on the page, and
// with -admin-addr the page is on the admin address only.
func TestUIKeysHidden(t *testing.T) {
	s := uiTraffic(t, "-ui-keys=false", "-admin-addr", "127.0.0.1:0")
	m := regexp.MustCompile(`msg="admin listening" addr=(\S+)`).FindStringSubmatch(s.logs.String())
	require.NotNil(t, m)
	r := get(t, s.URL+"/ui")
	assert.Equal(t, 404, r.status)
	assert.Contains(t, r.body, "/ui are on the admin address")
	page := get(t, "http://"+m[1]+"/ui").body
	for _, k := range []string{"mallory", ">eve<", `"eve"`, "bob", "api-1"} {
		assert.NotContains(t, page, k)
	}
	keys := topKeys(policyRow(t, page, "default"), "top-minute")
	require.Len(t, keys, 3)
	for _, k := range keys {
		assert.Regexp(t, `^#[0-9a-f]{16}$`, k)
	}
	assert.Equal(t, 0, s.stop(t))
}

// uiJSON is what the store tests read of /ui/data.
type uiJSON struct {
	Store struct {
		Kind    string `json:"kind"`
		Healthy bool   `json:"healthy"`
		Health  string `json:"health"`
		Breaker string `json:"breaker"`
		Outages []struct {
			Seconds float64 `json:"seconds"`
			Ongoing bool    `json:"ongoing"`
			Error   string  `json:"error"`
		} `json:"outages"`
		Latency *struct {
			Count uint64  `json:"count"`
			P50   float64 `json:"p50"`
		} `json:"latency"`
		Tables []struct {
			Policy string `json:"policy"`
			Slots  int    `json:"slots"`
			Used   int    `json:"used"`
			Locked int    `json:"locked"`
		} `json:"tables"`
	} `json:"store"`
}

func readUI(t *testing.T, url string) uiJSON {
	t.Helper()
	var d uiJSON
	require.NoError(t, json.Unmarshal([]byte(get(t, url+"/ui/data").body), &d))
	return d
}

// TestUIStoreOutage: with a real Redis killed under it, the page shows the
// store failing, the breaker open and an ongoing outage with its error;
// once Redis is back and decisions resume, the outage has ended, with its
// length.
func TestUIStoreOutage(t *testing.T) {
	rs := redistest.Start(t)
	s := serve(t, "-store", rs.URL(), "-rate", "100", "-burst", "100", "-fail", "open")
	assert.Equal(t, 200, get(t, s.URL+"/allow?key=a").status)
	d := readUI(t, s.URL)
	assert.Equal(t, "redis", d.Store.Kind)
	assert.True(t, d.Store.Healthy)
	assert.Equal(t, "closed", d.Store.Breaker)
	assert.Empty(t, d.Store.Outages)

	rs.Kill()
	for range 5 { // the breaker opens after 3 failures
		get(t, s.URL+"/allow?key=a")
	}
	d = readUI(t, s.URL)
	assert.False(t, d.Store.Healthy)
	assert.Contains(t, d.Store.Breaker, "open: store down")
	require.Len(t, d.Store.Outages, 1)
	assert.True(t, d.Store.Outages[0].Ongoing)
	assert.NotEmpty(t, d.Store.Outages[0].Error)

	rs.Restart()
	// A real process: wait for the breaker's probe to find Redis back.
	require.Eventually(t, func() bool {
		r := get(t, s.URL+"/allow?key=a")
		return r.status == 200 && !strings.Contains(r.body, "degraded")
	}, 20*time.Second, 20*time.Millisecond)
	d = readUI(t, s.URL)
	assert.True(t, d.Store.Healthy)
	require.Len(t, d.Store.Outages, 1)
	assert.False(t, d.Store.Outages[0].Ongoing)
	assert.Greater(t, d.Store.Outages[0].Seconds, 0.0)
	assert.Equal(t, 0, s.stop(t))
}

// TestUIShmTables: on the shm store the page shows each policy's table:
// its slots and those in use.
func TestUIShmTables(t *testing.T) {
	s := serve(t, "-store", "shm:"+shmDir(t), "-rate", "0.001", "-burst", "2", "-shm-slots", "1024")
	for _, k := range []string{"a", "b", "c", "c", "c"} {
		get(t, s.URL+"/allow?key="+k)
	}
	d := readUI(t, s.URL)
	assert.Equal(t, "shm", d.Store.Kind)
	assert.Equal(t, "none (an in-process store cannot fail that way)", d.Store.Breaker)
	require.Len(t, d.Store.Tables, 1)
	tb := d.Store.Tables[0]
	assert.Equal(t, "default", tb.Policy)
	assert.Equal(t, 1024, tb.Slots)
	assert.Equal(t, 3, tb.Used, "three keys whose buckets are not full")
	assert.Zero(t, tb.Locked)
	require.NotNil(t, d.Store.Latency)
	assert.EqualValues(t, 5, d.Store.Latency.Count)
	assert.Equal(t, 0, s.stop(t))
}
