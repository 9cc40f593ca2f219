package quorumlost

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/test/proc"
	"github.com/hale-dev/hale/test/promtest"
)

// A real Prometheus (test/promtest) scraping the real hub and agents with the shipped rules: nothing fires while all
// is well; etcd's quorum lost (with the hub suspended, so that it lasts) fires HaleEtcdQuorumLost and
// HaleSuspendedTooLong; lifting the suspension heals it and everything clears. Three of the six
// observers hung (SIGSTOP: the hub cannot tell a hang from a partition) fire HaleObserverMajorityLost
// and HaleHubNotPlanning (and HaleObserversMissing, its 15 min cut to a second too), cleared once they
// come back. Then every query of the Grafana dashboard
// parses and returns data over the test's time range, as Grafana asks for it.
func TestPrometheusAlertsAndDashboard(t *testing.T) {
	l := startLab(t)
	l.standalone()
	hubMetrics := fmt.Sprintf("127.0.0.1:%d", proc.FreePort(t))
	for i, a := range l.hubArgs {
		if a == "--metrics-address" {
			l.hubArgs[i+1] = hubMetrics
		}
	}
	l.startHub()
	l.waitStatus(90*time.Second, "every machine healthy", allHealthy)
	p := promtest.Start(t, promtest.Options{Dir: t.TempDir(), Addr: fmt.Sprintf("127.0.0.1:%d", proc.FreePort(t)),
		Rules:   filepath.Join("..", "..", "deploy", "alerts", "hale.rules.yaml"),
		Targets: map[string][]string{"hale-hub": {hubMetrics}, "hale-agent": l.scrape}})
	began := time.Now()
	p.WaitFiring(30*time.Second, "all well")

	hub := func(args ...string) {
		out, err := exec.Command(bins.Hub, append(args, "--socket", l.socket)...).CombinedOutput()
		require.NoError(t, err, "hub %v: %s", args, out)
	}
	hub("suspend", "--reason", "alert test")
	l.killEtcd(l.machines[1])
	l.killEtcd(l.machines[2])
	p.WaitFiring(60*time.Second, "quorum lost, hub suspended", "HaleEtcdQuorumLost", "HaleSuspendedTooLong")
	hub("unsuspend")
	l.waitStatus(90*time.Second, "healed", allHealthy)
	p.WaitFiring(60*time.Second, "healed")

	hung := []*proc.Process{l.witnesses[0], l.witnesses[1], l.machines[0].agent}
	for _, a := range hung {
		a.Signal(syscall.SIGSTOP)
	}
	p.WaitFiring(60*time.Second, "3 of 6 observers hung", "HaleObserverMajorityLost", "HaleHubNotPlanning", "HaleObserversMissing")
	for _, a := range hung {
		a.Signal(syscall.SIGCONT)
	}
	p.WaitFiring(60*time.Second, "observers back")

	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "components", "dashboard", "hale-dashboard.json"))
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(b, &dash))
	require.NotEmpty(t, dash.Panels)
	for _, panel := range dash.Panels {
		require.NotEmpty(t, panel.Targets, panel.Title)
		for _, tg := range panel.Targets {
			n, err := p.QueryRange(tg.Expr, began)
			require.NoError(t, err, "%s: %s", panel.Title, tg.Expr)
			assert.Positive(t, n, "%s: %s returns no data", panel.Title, tg.Expr)
			t.Logf("%s: %s: %d series", panel.Title, tg.Expr, n)
		}
	}
}
