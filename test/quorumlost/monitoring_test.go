package quorumlost

import (
	"encoding/json"
	"os"
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
	l.StartHub()
	l.waitStatus(90*time.Second, "every machine healthy", allHealthy)
	// Prometheus on the hub's host, as in a cluster: the hub's metrics on its loopback, every
	// agent's at its host's address.
	var agents []string
	for _, m := range l.Machines {
		agents = append(agents, m.Host.Addr(9101))
	}
	for _, h := range l.Witnesses {
		agents = append(agents, h.Addr(9101))
	}
	p := promtest.Start(t, promtest.Options{Dir: t.TempDir(), Addr: "127.0.0.1:9090",
		Rules:   filepath.Join("..", "..", "deploy", "alerts", "hale.rules.yaml"),
		Targets: map[string][]string{"hale-hub": {"127.0.0.1:9357"}, "hale-agent": agents},
		Start:   func(argv ...string) { l.HubHost.Start("prometheus", argv...) }, Dial: l.HubHost.Dial})
	began := time.Now()
	p.WaitFiring(30*time.Second, "all well")

	hub := func(args ...string) {
		out, err := l.HubCommand(t.Context(), args...)
		require.NoError(t, err, "hub %v: %s", args, out)
	}
	hub("suspend", "--reason", "alert test")
	l.Machines[1].KillEtcd()
	l.Machines[2].KillEtcd()
	p.WaitFiring(60*time.Second, "quorum lost, hub suspended", "HaleEtcdQuorumLost", "HaleSuspendedTooLong")
	hub("unsuspend")
	l.waitStatus(90*time.Second, "healed", allHealthy)
	p.WaitFiring(60*time.Second, "healed")

	_, agent, _ := l.Machines[0].Procs()
	hung := []*proc.Process{l.Witness("w-0"), l.Witness("w-1"), agent}
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
