package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/test/capture"
	"github.com/hale-dev/hale/test/etcdcluster"
	"github.com/hale-dev/hale/test/proc"
)

const testKey = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n"

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
	return p
}

func freePort(t *testing.T) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(proc.FreePort(t)))
}

func TestConfigErrorsNameTheField(t *testing.T) {
	key := writeFile(t, "key", testKey)
	tests := []struct {
		name string
		yaml string
		args []string
		want string
	}{
		{name: "unknown field", yaml: "cluster: c\ngossip: {keyFile: " + key + ", probeIntervall: 1s}\n", want: `agent.yaml:2: gossip.probeIntervall: unknown field; did you mean probeInterval?`},
		{name: "no cluster", yaml: "gossip: {keyFile: " + key + "}\n", want: "cluster: required"},
		{name: "no key", yaml: "cluster: c\n", want: "gossip.keyFile: required: gossip is always encrypted"},
		{name: "bad duration", yaml: "cluster: c\nreportInterval: soon\n", want: `want a duration like "500ms" or "2s", got "soon"`},
		{name: "bad bind", yaml: "cluster: c\ngossip: {keyFile: " + key + ", bind: nowhere}\n", want: `gossip.bind: "nowhere": want host:port`},
		{name: "timeout not below interval", yaml: "cluster: c\ngossip: {keyFile: " + key + ", probeInterval: 100ms, probeTimeout: 100ms}\n",
			want: "gossip.probeTimeout 100ms: must be shorter than gossip.probeInterval 100ms"},
		{name: "missing key file", yaml: "cluster: c\ngossip: {keyFile: /nonexistent/key, insecureNoIdentities: true}\n", want: "gossip key file: open /nonexistent/key"},
		{name: "no identities", yaml: "cluster: c\ngossip: {keyFile: " + key + "}\n",
			want: "gossip.identityFile and gossip.pinnedFile: per-node identities are on by default"},
		{name: "identities off, and a key", yaml: "cluster: c\ngossip: {keyFile: " + key + ", insecureNoIdentities: true, identityFile: id, pinnedFile: pinned}\n",
			want: "identities are either on or off"},
		{name: "an identity without the pinned keys", yaml: "cluster: c\ngossip: {keyFile: " + key + ", identityFile: id}\n",
			want: "gossip.identityFile and gossip.pinnedFile go together"},
		{name: "enrolment misspelt", yaml: "cluster: c\ngossip: {keyFile: " + key + ", identityFile: id, pinnedFile: pinned, enrol: kubernets}\n",
			want: `gossip.enrol: "kubernets": want kubernetes`},
		{name: "enrolment outside a pod", yaml: "cluster: c\ngossip: {keyFile: " + key + ", identityFile: " + filepath.Join(filepath.Dir(key), "id") +
			", pinnedFile: " + filepath.Join(filepath.Dir(key), "pinned") + ", enrol: kubernetes}\n",
			want: "gossip.enrol: kubernetes needs the agent in a pod with its service account token mounted"},
		{name: "bad role", yaml: "cluster: c\nrole: judge\ngossip: {keyFile: " + key + "}\n", want: `role "judge": want agent`},
		{name: "witness with a local member", yaml: "cluster: c\nrole: witness\ngossip: {keyFile: " + key + "}\netcd: {endpoint: http://127.0.0.1:2379}\n",
			want: "etcd.endpoint: a witness runs no etcd member"},
		{name: "witness with probes", yaml: "cluster: c\nrole: witness\ngossip: {keyFile: " + key + "}\nprobes: {kubelet: {enabled: true}}\n",
			want: "probes: a witness runs none"},
		{name: "witness with a probe's URL, not enabled", yaml: "cluster: c\nrole: witness\ngossip: {keyFile: " + key + "}\nprobes: {apiserver: {url: \"https://10.0.0.1:6443/readyz\"}}\n",
			want: "probes: a witness runs none"},
		{name: "agent reading from outside", yaml: "cluster: c\ngossip: {keyFile: " + key + "}\netcd: {endpoints: [http://127.0.0.1:2379]}\n",
			want: "etcd.endpoints: only a witness"},
		{name: "agent with an etcd:// endpoint", yaml: "cluster: c\ngossip: {keyFile: " + key + "}\netcd: {endpoint: \"etcd://10.0.0.1:2379\"}\n",
			want: `etcd.endpoint: "etcd://10.0.0.1:2379": want an http:// or https:// URL`},
		{name: "witness with a bad endpoint", yaml: "cluster: c\nrole: witness\ngossip: {keyFile: " + key + ", insecureNoIdentities: true}\netcd: {endpoints: [127.0.0.1:2379]}\n",
			want: `etcd.endpoints: "127.0.0.1:2379": want an http:// or https:// URL`},
		{name: "unknown probe", yaml: "cluster: c\ngossip: {keyFile: " + key + "}\nprobes: {kubelt: {enabled: false}}\n",
			want: `probes.kubelt: no probe named "kubelt" (known: ` + strings.Join(health.ProbeNames(), ", ") + ")"},
		{name: "unknown field of a probe", yaml: "cluster: c\ngossip: {keyFile: " + key + "}\nprobes: {kubelet: {urll: http://x}}\n",
			want: `probes.kubelet: json: unknown field "urll"`},
		{name: "a probe's own field", yaml: "cluster: c\ngossip: {keyFile: " + key + "}\nprobes: {etcdDisk: {minFreePercent: 150}}\n",
			want: "probes.etcdDisk.minFreePercent 150: want a percentage from 0 to below 100"},
		{name: "a probe's timeout", yaml: "cluster: c\ngossip: {keyFile: " + key + "}\nprobes: {clock: {interval: 1s, timeout: 2s}}\n",
			want: "probes.clock.timeout 2s: must not be longer than its interval 1s"},
		{name: "bad flag", args: []string{"-log-level", "loud"}, want: `-log-level "loud"`},
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "") // (as outside a pod)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.args
			if tt.yaml != "" {
				args = []string{"-config", writeFile(t, "agent.yaml", tt.yaml), "-listen", freePort(t)} // each case fails before binding
			}
			err := run(context.Background(), args, io.Discard, io.Discard, nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

// A relative path in the config file is the config file's directory's; one given by a flag, the
// working directory's.
func TestConfigPathsAreRelativeToTheFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "agent.yaml")
	require.NoError(t, os.WriteFile(path, []byte("cluster: c\ngossip: {keyFile: keys/gossip}\n"+
		"etcd: {endpoint: https://127.0.0.1:2379, tls: {ca: pki/ca.crt, cert: /abs/cert, key: ../key}}\n"+
		"probes: {etcdDisk: {dataDir: data}, apiserver: {tls: {ca: ca.pem}}}\n"), 0o600))
	t.Chdir(t.TempDir())
	c, err := loadConfig(path)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(dir, "keys", "gossip"), c.Gossip.KeyFile)
	assert.Equal(t, health.TLSFiles{CA: filepath.Join(dir, "pki", "ca.crt"), Cert: "/abs/cert", Key: filepath.Join(filepath.Dir(dir), "key")}, c.Etcd.TLS)
	assert.Equal(t, filepath.Join(dir, "data"), c.Probes.section("etcdDisk").(*health.DiskSection).DataDir)
	assert.Equal(t, filepath.Join(dir, "ca.pem"), c.Probes.section("apiserver").(*health.APIServerSection).TLS.CA)

	// The agent finds its key beside the config from anywhere; a key file given by a flag is the
	// working directory's.
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "keys"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "keys", "gossip"), []byte(testKey), 0o600))
	require.NoError(t, os.WriteFile(path, []byte("cluster: c\ngossip: {keyFile: keys/gossip, bind: 127.0.0.1:0, insecureNoIdentities: true}\nprobes: {etcd: {enabled: false}, etcdDisk: {enabled: false}, kubelet: {enabled: false}, apiserver: {enabled: false}}\n"), 0o600))
	startAgent(t, "-config", path, "-listen", freePort(t))
	err = run(context.Background(), []string{"-config", path, "-key-file", "keys/gossip", "-listen", freePort(t)}, io.Discard, io.Discard, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "gossip key file: open keys/gossip")
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

type agentProc struct {
	cancel context.CancelFunc
	done   chan error
	http   string
	logs   *capture.Buffer
}

// startAgent runs the agent as the binary does, with args, until the test ends.
func startAgent(t *testing.T, args ...string) *agentProc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &agentProc{cancel: cancel, done: make(chan error, 1), logs: &capture.Buffer{}}
	ready := make(chan string, 1)
	go func() { p.done <- run(ctx, args, io.Discard, p.logs, ready) }()
	select {
	case p.http = <-ready:
	case err := <-p.done:
		t.Fatalf("agent %v: %v", args, err)
	case <-time.After(10 * time.Second):
		t.Fatalf("agent %v did not start", args)
	}
	t.Cleanup(func() {
		cancel()
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
		}
	})
	return p
}

// TestAgentProcess runs two agents the way the binary does (flags and a config file), on a real
// single-member etcd, and checks their endpoints, metrics and a graceful leave.
func TestAgentProcess(t *testing.T) {
	c := etcdcluster.Start(t, 1)
	key := writeFile(t, "key", testKey)
	cfg := writeFile(t, "agent.yaml", fmt.Sprintf(`cluster: test
reportInterval: 200ms
gossip: {keyFile: %s, insecureNoIdentities: true}
etcd: {endpoint: %s}
probes:
  kubelet: {url: "http://127.0.0.1:1/healthz", interval: 200ms, timeout: 100ms}
  apiserver: {enabled: false}
  etcdDisk: {dataDir: %s}
`, key, c.Endpoints()[0], t.TempDir()))
	gossipA := freePort(t)
	start := func(node, bind string, extra ...string) *agentProc {
		return startAgent(t, append([]string{"-config", cfg, "-node", node, "-bind", bind, "-listen", "127.0.0.1:0"}, extra...)...)
	}
	a := start("cp-a", gossipA)
	b := start("cp-b", freePort(t), "-join", gossipA)

	require.Eventually(t, func() bool { code, _ := get(t, "http://"+b.http+"/readyz"); return code == 200 }, 10*time.Second, 50*time.Millisecond)
	code, body := get(t, "http://"+a.http+"/healthz")
	assert.Equal(t, 200, code, body)
	require.Eventually(t, func() bool {
		_, m := get(t, "http://"+a.http+"/metrics")
		return strings.Contains(m, `hale_agent_probe_ok{probe="etcd"} 1`) && strings.Contains(m, `hale_agent_probe_ok{probe="kubelet"} 0`) &&
			strings.Contains(m, `hale_agent_peers{state="alive"} 1`) && strings.Contains(m, `hale_agent_probe_ok{probe="clock"} 1`)
	}, 10*time.Second, 50*time.Millisecond)
	assert.Contains(t, a.logs.String(), `"msg":"probe failing","probe":"kubelet"`)
	_, m := get(t, "http://"+a.http+"/metrics")
	assert.Contains(t, m, `hale_agent_gossip_rejected_total{reason="future"} 0`)
	assert.Contains(t, m, "hale_agent_gossip_key_order_errors_total 0")
	// Prometheus's own linter on what the agent serves: names, units, help text (Debian's promtool,
	// which test/run installs).
	promtool, err := exec.LookPath("promtool")
	require.NoError(t, err, "promtool is not installed: apt-get install prometheus (test/run does)")
	lint := exec.Command(promtool, "check", "metrics")
	lint.Stdin = strings.NewReader(m)
	out, err := lint.CombinedOutput()
	assert.NoError(t, err, "promtool check metrics:\n%s", out)

	// A graceful stop: the peer records "left", not "dead".
	b.cancel()
	require.NoError(t, <-b.done)
	b.done <- nil
	require.Eventually(t, func() bool {
		_, m := get(t, "http://"+a.http+"/metrics")
		return strings.Contains(m, `hale_agent_peers{state="left"} 1`)
	}, 10*time.Second, 50*time.Millisecond)
	assert.NotContains(t, a.logs.String()+b.logs.String(), strings.TrimSpace(testKey))
}

// TestWitnessProcess runs a witness the way the binary does: no probes, no member of its own, the
// etcd membership read from outside, and every member's reachability from there, in its report.
func TestWitnessProcess(t *testing.T) {
	c := etcdcluster.Start(t, 3)
	key := writeFile(t, "key", testKey)
	cfg := writeFile(t, "witness.yaml", fmt.Sprintf("cluster: test\nrole: witness\nreportInterval: 200ms\ngossip: {keyFile: %s, insecureNoIdentities: true}\netcd: {endpoints: [%s]}\n",
		key, strings.Join(c.Endpoints(), ", ")))
	bind := freePort(t)
	w := startAgent(t, "-config", cfg, "-node", "w-1", "-bind", bind, "-listen", "127.0.0.1:0")
	c.Stop(2)

	// A listener in the pool, as the hub is.
	keys, err := health.LoadGossipKeys(key)
	require.NoError(t, err)
	g, err := health.StartGossip(health.GossipConfig{Node: "listener", Cluster: "test", Role: "hub", BindAddr: "127.0.0.1", Keys: keys})
	require.NoError(t, err)
	t.Cleanup(func() { _ = g.Shutdown() })
	_, err = g.Join([]string{bind})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		r, ok := g.Reports()["w-1"]
		if !ok || r.Etcd == nil || len(r.Etcd.Members) != 3 || len(r.Probes) != 0 || r.Etcd.LocalID != "" {
			return false
		}
		reach := map[string]bool{}
		for _, m := range r.Etcd.Members {
			reach[m.Name] = m.Reachable != nil && *m.Reachable
		}
		return reach[c.Name(0)] && reach[c.Name(1)] && !reach[c.Name(2)]
	}, 15*time.Second, 100*time.Millisecond, "the witness's report: %+v", g.Reports()["w-1"])
	assert.Contains(t, w.logs.String(), `"role":"witness"`)
}

// The agent's command line behaves as the hub's: --help and version succeed, -o as everywhere, a stray
// word or an unknown flag is an error, and the older -name spelling still works.
func TestCommandLine(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		out, err string
	}{
		{"help", []string{"--help"}, "--config string", ""},
		{"help, the older spelling", []string{"-help"}, "--config string", ""},
		{"version", []string{"version"}, "agent dev (", ""},
		{"--version", []string{"--version"}, "agent dev (", ""},
		{"-version, the older spelling", []string{"-version"}, "agent dev (", ""},
		{"version as YAML", []string{"version", "-o", "yaml"}, "version: dev\n", ""},
		{"version, an unknown format", []string{"version", "-o", "xml"}, "", `-o "xml": want table, wide, json or yaml`},
		{"a stray word", []string{"--config", "a.yaml", "stray"}, "", `unknown command "stray" for "agent"`},
		{"an unknown flag", []string{"--confgi", "a.yaml"}, "", "unknown flag: --confgi"},
		{"-name=value, the older spelling", []string{"-config=/nonexistent.yaml"}, "", "open /nonexistent.yaml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			err := run(context.Background(), tt.args, &out, io.Discard, nil)
			if tt.err == "" {
				require.NoError(t, err)
				assert.Contains(t, out.String(), tt.out)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.err)
		})
	}
}
