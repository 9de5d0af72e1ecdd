package cli

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-go/sluice/cmd/sluice/service"
	"github.com/sluice-go/sluice/store"
)

func rulesFile(domain string, rpu int) string {
	return "domain: " + domain + "\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: " + strconv.Itoa(rpu) + "}\n"
}

// serveOptions parses serve's flags as the command does.
func serveOptions(t *testing.T, args ...string) (service.Config, error) {
	t.Helper()
	var o ServeOptions
	fs := serveFlags(&o, io.Discard)
	if err := fs.Parse(args); err != nil {
		return service.Config{}, err
	}
	return o.config()
}

// -config may name files and directories and be repeated; every file is
// read, and a domain in two files needs -merge-domain-config.
func TestServeConfigFlag(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	write := func(path, body string) {
		t.Helper()
		require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	}
	write(filepath.Join(dir, "a.yaml"), rulesFile("a", 1))
	write(filepath.Join(dir, "b.yml"), rulesFile("b", 2))
	write(filepath.Join(dir, "README.md"), "not rules")
	c := filepath.Join(other, "c.yaml")
	write(c, rulesFile("c", 3))

	cfg, err := serveOptions(t, "-config", dir, "-config", c)
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b", "c"}, cfg.Rules.Domains(), "both -config, not the last alone")
	assert.Equal(t, []string{filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yml"), c}, cfg.Rules.Files)

	a2 := filepath.Join(other, "a2.yaml")
	write(a2, "domain: a\ndescriptors:\n  - key: j\n    rate_limit: {unit: second, requests_per_unit: 4}\n")
	_, err = serveOptions(t, "-config", dir, "-config", a2)
	assert.ErrorContains(t, err, "-config: "+a2+`:1: domain: "a" is configured twice (first in `+filepath.Join(dir, "a.yaml"))
	cfg, err = serveOptions(t, "-config", dir, "-config", a2, "-merge-domain-config")
	require.NoError(t, err)
	assert.True(t, cfg.RulesOptions.MergeDomains)
	assert.Len(t, cfg.Rules.Rules, 3)

	_, err = serveOptions(t, "-merge-domain-config")
	assert.EqualError(t, err, "-merge-domain-config needs -config")
	_, err = serveOptions(t, "-config", "")
	assert.ErrorContains(t, err, "empty path")
	_, err = serveOptions(t, "-config", t.TempDir())
	assert.ErrorContains(t, err, "no rules file (*.yaml, *.yml) in the directory")
}

// Polling sees a file added to, changed in and removed from a -config
// directory, each once it has held for two checks; a bad file keeps every
// rule in force; SIGHUP reloads at once.
func TestRulesReloadLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		write := func(name, body string) {
			t.Helper()
			require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600))
		}
		write("a.yaml", rulesFile("a", 1))
		reg := service.NewRegistry()
		mem := store.NewMemory()
		defer mem.Close()
		cfg, err := serveOptions(t, "-config", dir)
		require.NoError(t, err)
		cfg.Store, cfg.Registry = mem, reg
		cfg.Default = store.Policy{Rate: 1, Burst: 1}
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		srv, err := service.New(cfg)
		require.NoError(t, err)

		sig, tick := make(chan os.Signal), make(chan time.Time)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		paths := []string{dir}
		go func() { defer close(done); reloadLoop(ctx, srv, paths, sig, tick, rulesStamp(paths)) }()
		defer func() { cancel(); <-done }()

		value := func(name string, labels ...string) float64 {
			t.Helper()
			mfs, err := reg.Gather()
			require.NoError(t, err)
			for _, mf := range mfs {
				if mf.GetName() != name {
					continue
				}
				for _, m := range mf.GetMetric() {
					if len(labels) == 0 || m.GetLabel()[0].GetValue() == labels[0] {
						if m.GetGauge() != nil {
							return m.GetGauge().GetValue()
						}
						return m.GetCounter().GetValue()
					}
				}
			}
			return 0
		}
		check := func() { t.Helper(); tick <- time.Time{}; synctest.Wait() }
		state := func() [3]float64 {
			return [3]float64{value("sluice_config_rules"), value("sluice_config_reloads_total", "ok"), value("sluice_config_reloads_total", "error")}
		}

		check()
		assert.Equal(t, [3]float64{1, 0, 0}, state(), "nothing changed")
		write("b.yaml", rulesFile("b", 2))
		check()
		assert.Equal(t, [3]float64{1, 0, 0}, state(), "added: waits for one more check")
		check()
		assert.Equal(t, [3]float64{2, 1, 0}, state(), "added file loaded")
		check()
		assert.Equal(t, [3]float64{2, 1, 0}, state(), "one change, one reload")

		write("a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
		check()
		check()
		assert.Equal(t, [3]float64{2, 1, 1}, state(), "a bad file: every rule stays")

		write("a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 3}\n  - key: j\n    rate_limit: {unit: second, requests_per_unit: 3}\n")
		sig <- os.Interrupt
		synctest.Wait()
		assert.Equal(t, [3]float64{3, 2, 1}, state(), "SIGHUP: at once")

		require.NoError(t, os.Remove(filepath.Join(dir, "b.yaml")))
		check()
		check()
		assert.Equal(t, [3]float64{2, 3, 1}, state(), "removed file's rules gone")
	})
}

// -sweep is 0 (off) or at least MinSweep: a sweep interval of nanoseconds
// made the memory store's calls sweep a shard each, and a negative one was
// taken for 0.
func TestServeSweepFlag(t *testing.T) {
	for _, v := range []string{"0", "1s", "1m"} {
		_, err := serveOptions(t, "-sweep", v)
		require.NoError(t, err, v)
	}
	for v, want := range map[string]string{
		"1ns":   "-sweep 1ns: below the 1s minimum",
		"999ms": "-sweep 999ms: below the 1s minimum",
		"-1m":   "-sweep -1m0s: must not be negative",
	} {
		_, err := serveOptions(t, "-sweep", v)
		require.Error(t, err, v)
		assert.Contains(t, err.Error(), want, v)
	}
}
