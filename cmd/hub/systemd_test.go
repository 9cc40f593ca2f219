package main

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The systemd units docs/install.md tells an operator to install are units systemd accepts
// (systemd-analyze verify: no error, no warning), and the hub's command line in hale-hub.service is one
// the hub takes (every flag known: `hub run … --help` parses them first).
func TestSystemdUnits(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	require.NoError(t, err, "systemd-analyze (Debian: apt-get install systemd; test/run installs it)")
	exe, err := os.Executable()
	require.NoError(t, err)
	dir := t.TempDir()
	var units []string
	for _, name := range []string{"hale-agent.service", "hale-hub.service"} {
		b, err := os.ReadFile(filepath.Join("../../deploy/systemd", name))
		require.NoError(t, err)
		// systemd-analyze checks that ExecStart's program exists: any executable stands in for it.
		unit := strings.NewReplacer("/usr/local/bin/hub", exe, "/usr/local/bin/agent", exe).Replace(string(b))
		units = append(units, filepath.Join(dir, name))
		require.NoError(t, os.WriteFile(units[len(units)-1], []byte(unit), 0o644))
	}
	out, err := exec.Command(analyze, append([]string{"verify"}, units...)...).CombinedOutput()
	assert.NoError(t, err, "%s", out)
	assert.Empty(t, strings.TrimSpace(string(out)), "systemd-analyze verify says something about the units")

	args := execStart(t, "../../deploy/systemd/hale-hub.service")
	require.Equal(t, "/usr/local/bin/hub", args[0])
	// Nothing of one site in the unit: the agents to join come from its EnvironmentFile.
	assert.Contains(t, args, "${HALE_JOIN}")
	assert.NotRegexp(t, `\d+\.\d+\.\d+\.\d+`, strings.Join(args, " "), "an address in the hub's command line")
	// Each its own state directory: systemd would hand a shared one from root (the agent) to hale (the
	// hub) and back on a host that runs both.
	assert.Equal(t, "hale", directive(t, "../../deploy/systemd/hale-agent.service", "StateDirectory"))
	assert.Equal(t, "hale-hub", directive(t, "../../deploy/systemd/hale-hub.service", "StateDirectory"))
	for i, a := range args {
		if a == "--journal" {
			assert.True(t, strings.HasPrefix(args[i+1], "/var/lib/hale-hub/"), "the journal in the hub's state directory: %s", args[i+1])
		}
	}
	cmd := newRootCommand(io.Discard, io.Discard)
	cmd.SetArgs(append(args[1:], "--help"))
	assert.NoError(t, cmd.Execute(), "hale-hub.service's command line: %q", args)
}

// directive is the value of a unit's key (the first).
func directive(t *testing.T, unit, key string) string {
	b, err := os.ReadFile(unit)
	require.NoError(t, err)
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, key+"="); ok {
			return v
		}
	}
	t.Fatalf("%s has no %s", unit, key)
	return ""
}

// execStart is the unit's ExecStart command line, its continuation lines joined.
func execStart(t *testing.T, unit string) []string {
	b, err := os.ReadFile(unit)
	require.NoError(t, err)
	text := strings.ReplaceAll(string(b), "\\\n", " ")
	for l := range strings.SplitSeq(text, "\n") {
		if v, ok := strings.CutPrefix(l, "ExecStart="); ok {
			return strings.Fields(v)
		}
	}
	t.Fatalf("%s has no ExecStart", unit)
	return nil
}
