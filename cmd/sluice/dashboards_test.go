package main_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

const (
	dashboardFile = "../../docs/grafana/sluice.json"
	rulesFile     = "../../docs/prometheus/sluice-rules.yaml"
)

// promtool returns the path of promtool, or skips saying so (and fails
// when SLUICE_REQUIRE_PROMTOOL is set, as .ci/run does).
func promtool(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("promtool"); err == nil {
		return p
	}
	if os.Getenv("SLUICE_REQUIRE_PROMTOOL") != "" {
		t.Fatal("promtool not found on PATH and SLUICE_REQUIRE_PROMTOOL is set (Debian: apt-get install prometheus)")
	}
	t.Skip("SKIP: promtool not found on PATH, so the alert rules are not checked (Debian: apt-get install prometheus; set SLUICE_REQUIRE_PROMTOOL=1 to make this a failure)")
	return ""
}

// TestPrometheusRules checks docs/prometheus/sluice-rules.yaml with
// `promtool check rules`, and runs its unit tests
// (testdata/sluice-rules-test.yaml: each alert fires on the series that
// should fire it, and not before).
func TestPrometheusRules(t *testing.T) {
	bin := promtool(t)
	out, err := exec.Command(bin, "check", "rules", rulesFile).CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "SUCCESS")
	out, err = exec.Command(bin, "test", "rules", "testdata/sluice-rules-test.yaml").CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "SUCCESS")
}

// metricRE finds the metric names a PromQL expression reads: every series
// `serve` exports starts with one of these prefixes.
var metricRE = regexp.MustCompile(`\b((?:sluice|process|go)_[a-zA-Z0-9_]+)`)

// queried returns the metric names the dashboard's panels and the alert
// rules query, by where they are used.
func queried(t *testing.T) map[string][]string {
	t.Helper()
	used := map[string][]string{}
	add := func(where, expr string) {
		for _, m := range metricRE.FindAllStringSubmatch(expr, -1) {
			used[m[1]] = append(used[m[1]], where)
		}
	}
	raw, err := os.ReadFile(dashboardFile)
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	panels := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			require.NotEmpty(t, tg.Expr, "panel %q", p.Title)
			add("panel "+p.Title, tg.Expr)
			panels++
		}
	}
	require.Greater(t, panels, 10)
	for _, v := range dash.Templating.List {
		add("variable "+v.Name, v.Definition)
	}
	raw, err = os.ReadFile(rulesFile)
	require.NoError(t, err)
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &rules))
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			require.NotEmpty(t, r.Expr, "rule %q", r.Alert)
			add("rule "+r.Alert, r.Expr)
		}
	}
	return used
}

var helpRE = regexp.MustCompile(`(?m)^# TYPE (\S+) (\S+)$`)

// exported returns the metric names a /metrics page declares (its TYPE
// lines), with a histogram's _bucket, _sum and _count series.
func exported(page string) map[string]bool {
	names := map[string]bool{}
	for _, m := range helpRE.FindAllStringSubmatch(page, -1) {
		names[m[1]] = true
		if m[2] == "histogram" || m[2] == "summary" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[m[1]+s] = true
			}
		}
	}
	return names
}

// TestDashboardAndRulesQueryExportedMetrics: every metric a panel of
// docs/grafana/sluice.json or a rule of docs/prometheus/sluice-rules.yaml
// queries is one a real `sluice serve` exports. Some series appear only
// after an event (a bad request, a reload), so the servers get those too;
// the names are read from the TYPE lines. The shm tables' metrics come from
// a serve on the shm store.
func TestDashboardAndRulesQueryExportedMetrics(t *testing.T) {
	used := queried(t)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(rules, []byte("domain: http\ndescriptors:\n  - key: key\n    value: api\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o600))
	names := map[string]bool{}
	for _, st := range []string{"memory", "shm:" + shmDir(t)} {
		s := serve(t, "-store", st, "-rate", "1", "-burst", "1", "-config", rules)
		for _, k := range []string{"a", "a", "api", "api"} {
			get(t, s.URL+"/allow?key="+k)
		}
		assert.Equal(t, 400, get(t, s.URL+"/allow").status)
		require.NoError(t, s.cmd.Process.Signal(syscall.SIGHUP))
		require.Eventually(t, func() bool { return strings.Contains(s.logs.String(), `msg="rules reloaded"`) },
			10*time.Second, 10*time.Millisecond)
		for n := range exported(get(t, s.URL+"/metrics").body) {
			names[n] = true
		}
		assert.Equal(t, 0, s.stop(t))
	}
	require.True(t, names["sluice_locked_slots"], "the shm serve exports its tables' metrics")
	var missing []string
	for n, where := range used {
		if !names[n] {
			missing = append(missing, n+" (in "+strings.Join(slices.Compact(where), ", ")+")")
		}
	}
	slices.Sort(missing)
	assert.Empty(t, missing, "queried but not exported by sluice serve")
	for _, want := range []string{"sluice_store_errors_total", "sluice_fail_open_decisions_total", "sluice_config_reloads_total",
		"sluice_locked_slots", "sluice_decisions_total"} {
		assert.Contains(t, used, want, "the rules and the dashboard cover it")
	}
}
