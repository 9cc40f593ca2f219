package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// promtool runs Debian's promtool (test/run installs the prometheus package) and returns its output.
func promtool(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	require.NoError(t, err, "promtool is not installed: apt-get install prometheus (test/run does)")
	cmd := exec.Command(path, args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// The alert rules are valid, every alert fires in its unit test and stays quiet where it must
// (deploy/alerts/hale.rules.test.yaml), and the PrometheusRule component carries the same groups.
func TestAlertRules(t *testing.T) {
	dir := filepath.Join("..", "..", "deploy", "alerts")
	out, err := promtool(t, "", "check", "rules", filepath.Join(dir, "hale.rules.yaml"))
	require.NoError(t, err, out)
	assert.Contains(t, out, "SUCCESS: 16 rules found")
	out, err = promtool(t, "", "test", "rules", filepath.Join(dir, "hale.rules.test.yaml"))
	require.NoError(t, err, out)

	var plain struct {
		Groups any `json:"groups"`
	}
	var operator struct {
		Kind string `json:"kind"`
		Spec struct {
			Groups any `json:"groups"`
		} `json:"spec"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "hale.rules.yaml"))
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, &plain))
	b, err = os.ReadFile(filepath.Join("..", "..", "deploy", "components", "alerts", "prometheusrule.yaml"))
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, &operator))
	assert.Equal(t, "PrometheusRule", operator.Kind)
	assert.Equal(t, plain.Groups, operator.Spec.Groups, "deploy/components/alerts holds the same rules as deploy/alerts/hale.rules.yaml")
}

// Every alert names a severity, a summary, a description and a runbook, as the kube-prometheus mixins do.
func TestAlertConventions(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "alerts", "hale.rules.yaml"))
	require.NoError(t, err)
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `json:"alert"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(b, &f))
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			assert.True(t, strings.HasPrefix(r.Alert, "Hale"), r.Alert)
			assert.Contains(t, []string{"warning", "critical"}, r.Labels["severity"], r.Alert)
			for _, a := range []string{"summary", "description", "runbook_url"} {
				assert.NotEmpty(t, r.Annotations[a], "%s: %s", r.Alert, a)
			}
		}
	}
}

// The dashboard component renders a ConfigMap the Grafana sidecar loads (label grafana_dashboard "1")
// holding exactly deploy/components/dashboard/hale-dashboard.json, which is a dashboard whose every
// panel has a description and a query (test/quorumlost runs each against a real Prometheus).
func TestDashboardComponent(t *testing.T) {
	dir := t.TempDir()
	abs, err := filepath.Abs(filepath.Join("..", "..", "deploy", "components", "dashboard"))
	require.NoError(t, err)
	rel, err := filepath.Rel(dir, abs)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte("components: ["+rel+"]\n"), 0o600))
	out, err := kubectl(t, "kustomize", dir)
	require.NoError(t, err, out)
	var cm struct {
		Kind     string            `json:"kind"`
		Metadata map[string]any    `json:"metadata"`
		Data     map[string]string `json:"data"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(out), &cm))
	assert.Equal(t, "ConfigMap", cm.Kind)
	assert.Equal(t, map[string]any{"grafana_dashboard": "1", "app.kubernetes.io/part-of": "hale"}, cm.Metadata["labels"])
	file, err := os.ReadFile(filepath.Join(abs, "hale-dashboard.json"))
	require.NoError(t, err)
	assert.Equal(t, string(file), cm.Data["hale-dashboard.json"])
	var dash struct {
		UID    string `json:"uid"`
		Panels []struct {
			Title, Description string
			Targets            []struct{ Expr string }
		} `json:"panels"`
	}
	require.NoError(t, yaml.Unmarshal(file, &dash))
	assert.Equal(t, "hale", dash.UID)
	for _, p := range dash.Panels {
		assert.NotEmpty(t, p.Description, p.Title)
		assert.NotEmpty(t, p.Targets, p.Title)
	}
}
