package quorumlost

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/test/proc"
)

// prometheus is a real Prometheus server (Debian's package) scraping the lab's hub and agents every
// second with the shipped alert rules, their `for` durations cut to a second so that a scenario of
// seconds shows what minutes would.
type prometheus struct {
	t    *testing.T
	addr string
}

func startPrometheus(t *testing.T, l *lab, hubMetrics string) *prometheus {
	bin, err := exec.LookPath("prometheus")
	require.NoError(t, err, "the prometheus server (Debian: apt-get install prometheus; test/run installs it)")
	rules, err := os.ReadFile(filepath.Join("..", "..", "deploy", "alerts", "hale.rules.yaml"))
	require.NoError(t, err)
	fast := regexp.MustCompile(`(?m)^(\s+for: )\S+$`).ReplaceAllString(string(rules), "${1}1s")
	require.NotEqual(t, string(rules), fast)
	l.write("hale.rules.yaml", fast)
	var agents []string
	for _, a := range l.scrape {
		agents = append(agents, `"`+a+`"`)
	}
	cfg := l.write("prometheus.yml", fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [hale.rules.yaml]
scrape_configs:
  - job_name: hale-hub
    static_configs: [{targets: ["%s"]}]
  - job_name: hale-agent
    static_configs: [{targets: [%s]}]
`, hubMetrics, strings.Join(agents, ", ")))
	p := &prometheus{t: t, addr: fmt.Sprintf("127.0.0.1:%d", proc.FreePort(t))}
	pr := proc.Start(t, "prometheus", exec.Command(bin, "--config.file", cfg, "--storage.tsdb.path", filepath.Join(l.dir, "tsdb"),
		"--web.listen-address", p.addr))
	pr.WaitReady(t, "http://"+p.addr+"/-/ready", 60*time.Second)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var r struct {
			Data struct {
				ActiveTargets []struct {
					Health string `json:"health"`
					URL    string `json:"scrapeUrl"`
				} `json:"activeTargets"`
			} `json:"data"`
		}
		require.NoError(c, p.get("/api/v1/targets", nil, &r))
		require.Len(c, r.Data.ActiveTargets, 1+len(l.scrape))
		for _, tg := range r.Data.ActiveTargets {
			assert.Equal(c, "up", tg.Health, tg.URL)
		}
	}, 60*time.Second, time.Second, "every target up")
	return p
}

func (p *prometheus) get(path string, q url.Values, into any) error {
	resp, err := http.Get("http://" + p.addr + path + "?" + q.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(into)
}

// firing is the alerts firing now, sorted.
func (p *prometheus) firing() []string {
	var r struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		} `json:"data"`
	}
	require.NoError(p.t, p.get("/api/v1/alerts", nil, &r))
	var out []string
	for _, a := range r.Data.Alerts {
		if a.State == "firing" && !slices.Contains(out, a.Labels["alertname"]) {
			out = append(out, a.Labels["alertname"])
		}
	}
	sort.Strings(out)
	return out
}

// waitFiring waits until the alerts firing are exactly want (none: want empty).
func (p *prometheus) waitFiring(within time.Duration, what string, want ...string) {
	p.t.Helper()
	sort.Strings(want)
	start := time.Now()
	var got []string
	for time.Since(start) < within {
		if got = p.firing(); slices.Equal(got, want) {
			p.t.Logf("%s: firing %v after %v", what, got, time.Since(start).Round(100*time.Millisecond))
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	p.t.Fatalf("%s: firing %v, want %v (within %v)", what, got, want, within)
}

// queryRange runs expr as Grafana does, over [from, now] at 1 s steps, and returns its series count.
func (p *prometheus) queryRange(expr string, from time.Time) (int, error) {
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	q := url.Values{"query": {expr}, "start": {fmt.Sprint(from.Unix())}, "end": {fmt.Sprint(time.Now().Unix())}, "step": {"1"}}
	if err := p.get("/api/v1/query_range", q, &r); err != nil {
		return 0, err
	}
	if r.Status != "success" {
		return 0, fmt.Errorf("%s", r.Error)
	}
	return len(r.Data.Result), nil
}

// A real Prometheus scraping the real hub and agents with the shipped rules: nothing fires while all
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
	p := startPrometheus(t, l, hubMetrics)
	began := time.Now()
	p.waitFiring(30*time.Second, "all well")

	hub := func(args ...string) {
		out, err := exec.Command(bins.Hub, append(args, "--socket", l.socket)...).CombinedOutput()
		require.NoError(t, err, "hub %v: %s", args, out)
	}
	hub("suspend", "--reason", "alert test")
	l.killEtcd(l.machines[1])
	l.killEtcd(l.machines[2])
	p.waitFiring(60*time.Second, "quorum lost, hub suspended", "HaleEtcdQuorumLost", "HaleSuspendedTooLong")
	hub("unsuspend")
	l.waitStatus(90*time.Second, "healed", allHealthy)
	p.waitFiring(60*time.Second, "healed")

	hung := []*proc.Process{l.witnesses[0], l.witnesses[1], l.machines[0].agent}
	for _, a := range hung {
		a.Signal(syscall.SIGSTOP)
	}
	p.waitFiring(60*time.Second, "3 of 6 observers hung", "HaleObserverMajorityLost", "HaleHubNotPlanning", "HaleObserversMissing")
	for _, a := range hung {
		a.Signal(syscall.SIGCONT)
	}
	p.waitFiring(60*time.Second, "observers back")

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
			n, err := p.queryRange(tg.Expr, began)
			require.NoError(t, err, "%s: %s", panel.Title, tg.Expr)
			assert.Positive(t, n, "%s: %s returns no data", panel.Title, tg.Expr)
			t.Logf("%s: %s: %d series", panel.Title, tg.Expr, n)
		}
	}
}
