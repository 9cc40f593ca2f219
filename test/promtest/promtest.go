// Package promtest runs a real Prometheus server (Debian's prometheus package) for a test: it scrapes
// the given targets every second with Hale's shipped alert rules, their `for` durations cut to a
// second so that a scenario of seconds shows what minutes would, and answers the test's questions
// through its HTTP API (alerts firing, range queries as Grafana asks them).
package promtest

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hale-dev/hale/test/proc"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Options place the server.
type Options struct {
	// Dir holds its configuration and data.
	Dir string
	// Addr is where it listens (host:port).
	Addr string
	// Rules is the rule file to load (deploy/alerts/hale.rules.yaml).
	Rules string
	// Targets are the scrape targets by job name.
	Targets map[string][]string
	// Start starts the server's command line (default: a child process killed when the test ends);
	// the network-namespace lab starts it inside a namespace.
	Start func(argv ...string)
	// Dial, when set, reaches Addr (a namespace's address from outside it).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Server is a running Prometheus.
type Server struct {
	t      *testing.T
	addr   string
	client *http.Client
}

// Start starts Prometheus and waits until every target is up.
func Start(t *testing.T, o Options) *Server {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	require.NoError(t, err, "the prometheus server (Debian: apt-get install prometheus; test/run installs it)")
	rules, err := os.ReadFile(o.Rules)
	require.NoError(t, err)
	fast := regexp.MustCompile(`(?m)^(\s+for: )\S+$`).ReplaceAllString(string(rules), "${1}1s")
	require.NotEqual(t, string(rules), fast, "no `for:` in %s", o.Rules)
	require.NoError(t, os.WriteFile(filepath.Join(o.Dir, "rules.yaml"), []byte(fast), 0o600))
	var cfg strings.Builder
	cfg.WriteString("global: {scrape_interval: 1s, evaluation_interval: 1s}\nrule_files: [rules.yaml]\nscrape_configs:\n")
	total := 0
	for _, job := range slices.Sorted(maps.Keys(o.Targets)) {
		quoted := make([]string, len(o.Targets[job]))
		for i, a := range o.Targets[job] {
			quoted[i] = `"` + a + `"`
		}
		total += len(quoted)
		fmt.Fprintf(&cfg, "  - job_name: %s\n    static_configs: [{targets: [%s]}]\n", job, strings.Join(quoted, ", "))
	}
	cfgFile := filepath.Join(o.Dir, "prometheus.yml")
	require.NoError(t, os.WriteFile(cfgFile, []byte(cfg.String()), 0o600))
	argv := []string{bin, "--config.file", cfgFile, "--storage.tsdb.path", filepath.Join(o.Dir, "tsdb"), "--web.listen-address", o.Addr}
	if o.Start != nil {
		o.Start(argv...)
	} else {
		proc.Start(t, "prometheus", exec.Command(argv[0], argv[1:]...))
	}
	s := &Server{t: t, addr: o.Addr, client: &http.Client{Timeout: 10 * time.Second}}
	if o.Dial != nil {
		s.client.Transport = &http.Transport{DialContext: o.Dial}
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var r struct {
			Data struct {
				ActiveTargets []struct {
					Health string `json:"health"`
					URL    string `json:"scrapeUrl"`
				} `json:"activeTargets"`
			} `json:"data"`
		}
		require.NoError(c, s.get("/api/v1/targets", nil, &r))
		require.Len(c, r.Data.ActiveTargets, total)
		for _, tg := range r.Data.ActiveTargets {
			assert.Equal(c, "up", tg.Health, tg.URL)
		}
	}, 90*time.Second, time.Second, "prometheus: every target up")
	return s
}

func (s *Server) get(path string, q url.Values, into any) error {
	resp, err := s.client.Get("http://" + s.addr + path + "?" + q.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(into)
}

// Firing is the names of the alerts firing now, sorted.
func (s *Server) Firing() ([]string, error) {
	var r struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		} `json:"data"`
	}
	if err := s.get("/api/v1/alerts", nil, &r); err != nil {
		return nil, err
	}
	var out []string
	for _, a := range r.Data.Alerts {
		if a.State == "firing" && !slices.Contains(out, a.Labels["alertname"]) {
			out = append(out, a.Labels["alertname"])
		}
	}
	sort.Strings(out)
	return out, nil
}

// WaitFiring waits until the alerts firing are exactly want (none: want empty); the test fails
// otherwise, naming what fired.
func (s *Server) WaitFiring(within time.Duration, what string, want ...string) {
	s.t.Helper()
	sort.Strings(want)
	start := time.Now()
	var got []string
	var err error
	for time.Since(start) < within {
		if got, err = s.Firing(); err == nil && slices.Equal(got, want) {
			s.t.Logf("%s: firing %v after %v", what, got, time.Since(start).Round(100*time.Millisecond))
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	s.t.Fatalf("%s: firing %v (err %v), want %v (within %v)", what, got, err, want, within)
}

// QueryRange runs expr as Grafana does, over [from, now] at 1 s steps, and returns its series count.
func (s *Server) QueryRange(expr string, from time.Time) (int, error) {
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	q := url.Values{"query": {expr}, "start": {fmt.Sprint(from.Unix())}, "end": {fmt.Sprint(time.Now().Unix())}, "step": {"1"}}
	if err := s.get("/api/v1/query_range", q, &r); err != nil {
		return 0, err
	}
	if r.Status != "success" {
		return 0, fmt.Errorf("%s", r.Error)
	}
	return len(r.Data.Result), nil
}
