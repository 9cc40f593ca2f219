package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/test/capture"
	"github.com/hale-dev/hale/test/etcdcluster"
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
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

func TestConfigErrorsNameTheField(t *testing.T) {
	key := writeFile(t, "key", testKey)
	tests := []struct {
		name string
		yaml string
		args []string
		want string
	}{
		{name: "unknown field", yaml: "cluster: c\ngossip: {keyFile: " + key + ", probeIntervall: 1s}\n", want: `unknown field "probeIntervall"`},
		{name: "no cluster", yaml: "gossip: {keyFile: " + key + "}\n", want: "cluster: required"},
		{name: "no key", yaml: "cluster: c\n", want: "gossip.keyFile: required: gossip is always encrypted"},
		{name: "bad duration", yaml: "cluster: c\nreportInterval: soon\n", want: `want a duration like "500ms" or "2s", got "soon"`},
		{name: "bad bind", yaml: "cluster: c\ngossip: {keyFile: " + key + ", bind: nowhere}\n", want: `gossip.bind: "nowhere": want host:port`},
		{name: "timeout not below interval", yaml: "cluster: c\ngossip: {keyFile: " + key + ", probeInterval: 100ms, probeTimeout: 100ms}\n",
			want: "gossip.probeTimeout 100ms: must be shorter than gossip.probeInterval 100ms"},
		{name: "missing key file", yaml: "cluster: c\ngossip: {keyFile: /nonexistent/key}\n", want: "gossip key file: open /nonexistent/key"},
		{name: "bad flag", args: []string{"-log-level", "loud"}, want: `-log-level "loud"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := tt.args
			if tt.yaml != "" {
				args = []string{"-config", writeFile(t, "agent.yaml", tt.yaml), "-listen", freePort(t)} // each case fails before binding
			}
			err := run(context.Background(), args, io.Discard, nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestAgentProcess runs two agents the way the binary does (flags and a config file), on a real
// single-member etcd, and checks their endpoints, metrics and a graceful leave.
func TestAgentProcess(t *testing.T) {
	c := etcdcluster.Start(t, 1)
	key := writeFile(t, "key", testKey)
	cfg := writeFile(t, "agent.yaml", fmt.Sprintf(`cluster: test
reportInterval: 200ms
gossip: {keyFile: %s}
etcd: {endpoint: %s}
probes:
  kubelet: {url: "http://127.0.0.1:1/healthz", interval: 200ms, timeout: 100ms}
  apiserver: {enabled: false}
  etcdDisk: {dataDir: %s}
`, key, c.Endpoints()[0], t.TempDir()))
	gossipA := freePort(t)
	type agentProc struct {
		cancel context.CancelFunc
		done   chan error
		http   string
		logs   *capture.Buffer
	}
	start := func(node, bind string, extra ...string) *agentProc {
		ctx, cancel := context.WithCancel(context.Background())
		p := &agentProc{cancel: cancel, done: make(chan error, 1), logs: &capture.Buffer{}}
		ready := make(chan string, 1)
		args := append([]string{"-config", cfg, "-node", node, "-bind", bind, "-listen", "127.0.0.1:0"}, extra...)
		go func() { p.done <- run(ctx, args, p.logs, ready) }()
		select {
		case p.http = <-ready:
		case err := <-p.done:
			t.Fatalf("agent %s: %v", node, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("agent %s did not start", node)
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
