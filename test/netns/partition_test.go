package netns

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/quorum"
	"github.com/hale-dev/hale/test/proc"
	"github.com/hale-dev/hale/test/promtest"
)

// bins are the binaries under test, built once for the package.
var bins Binaries

func TestMain(m *testing.M) {
	if why := Available(); why != "" {
		fmt.Fprintf(os.Stderr, "test/netns: %s: these tests need root and real network namespaces\n", why)
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "hale-netns-bins-")
	if err != nil {
		panic(err)
	}
	if bins, err = Build(dir); err != nil {
		fmt.Fprintf(os.Stderr, "test/netns: %v\n", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// cluster is three control-plane hosts (a real etcd member and a real agent each), and a hub host
// (the real `hub run`, with its bbolt journal, and the Redfish simulator for the three machines'
// BMCs).
type cluster struct {
	lab    *Lab
	cps    []*Host
	hubH   *Host
	hub    *proc.Process
	dir    string
	socket string
}

func startCluster(t *testing.T) *cluster {
	lab := New(t)
	c := &cluster{lab: lab, dir: t.TempDir()}
	c.socket = filepath.Join(c.dir, "hub.sock")
	for i := range 3 {
		c.cps = append(c.cps, lab.Host(fmt.Sprintf("cp-%d", i)))
	}
	c.hubH = lab.Host("hub")
	key := make([]byte, 32)
	for i := range key {
		key[i] = byte(i*7 + 3)
	}
	keyFile := c.write(t, "gossip.key", base64.StdEncoding.EncodeToString(key)+"\n")
	var initial, joins []string
	for i, h := range c.cps {
		initial = append(initial, fmt.Sprintf("etcd-%d=http://%s", i, h.Addr(2380)))
		joins = append(joins, h.Addr(7946))
	}
	for i, h := range c.cps {
		h.Start(fmt.Sprintf("etcd-%d", i), bins.Etcd, "--name", fmt.Sprintf("etcd-%d", i), "--data-dir", filepath.Join(c.dir, fmt.Sprintf("etcd-%d", i)),
			"--listen-client-urls", "http://"+h.Addr(2379), "--advertise-client-urls", "http://"+h.Addr(2379),
			"--listen-peer-urls", "http://"+h.Addr(2380), "--initial-advertise-peer-urls", "http://"+h.Addr(2380),
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new", "--initial-cluster-token", "lab")
		cfg := c.write(t, fmt.Sprintf("agent-%d.yaml", i), fmt.Sprintf(`cluster: lab
node: cp-%d
reportInterval: 1s
listen: 127.0.0.1:9101
gossip: {bind: "%s", join: [%s], keyFile: %s}
etcd: {endpoint: "http://%s"}
probes: {kubelet: {enabled: false}, apiserver: {enabled: false}, etcdDisk: {enabled: false}}
`, i, h.Addr(7946), strings.Join(joins, ", "), keyFile, h.Addr(2379)))
		h.Start(fmt.Sprintf("agent-%d", i), bins.Agent, "-config", cfg)
	}
	creds := c.write(t, "bmc-credentials", "username=admin\npassword=lab-secret\n")
	c.hubH.Start("bmcsim", bins.Demo, "bmc-simulator", "--http", "--listen", "127.0.0.1:8443", "--system", "cp-0,cp-1,cp-2",
		"--credentials", creds, "--state-dir", filepath.Join(c.dir, "bmcsim"), "--cycle-off", "200ms", "--power-on-delay", "200ms", "--shutdown-delay", "200ms")
	var machines strings.Builder
	for i := range c.cps {
		fmt.Fprintf(&machines, "  - {name: cp-%d, member: etcd-%d, class: cp, bmc: {endpoint: \"redfish+http://127.0.0.1:8443/systems/cp-%d\", credentials: %s}}\n", i, i, i, creds)
	}
	inv := c.write(t, "inventory.yaml", "cluster: lab\npolicy: {cooldown: 1s}\nclasses: {cp: {strategy: reboot}}\nmachines:\n"+machines.String())
	c.hub = c.hubH.Start("hub", bins.Hub, "run", "--inventory", inv, "--gossip-key-file", keyFile, "--join", strings.Join(joins, ","),
		"--gossip-bind", c.hubH.Addr(7947), "--journal", filepath.Join(c.dir, "journal.db"), "--socket", c.socket, "--metrics-address", "127.0.0.1:9357")
	return c
}

func (c *cluster) write(t *testing.T, name, body string) string {
	p := filepath.Join(c.dir, name)
	require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
	return p
}

// status asks the running hub over its socket (a path: not confined to the hub's namespace).
func (c *cluster) status(ctx context.Context) (hub.Status, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bins.Hub, "status", "-o", "json", "--socket", c.socket).Output()
	if err != nil {
		return hub.Status{}, err
	}
	var st hub.Status
	return st, json.Unmarshal(out, &st)
}

func allHealthy(st hub.Status) bool {
	if len(st.Machines) == 0 || !st.Observers.Majority {
		return false
	}
	for _, m := range st.Machines {
		if m.Verdict != hub.VerdictHealthy || m.EtcdHealth != quorum.Healthy.String() || m.Remediation != nil {
			return false
		}
	}
	return true
}

func (c *cluster) waitHealthy(t *testing.T, timeout time.Duration, what string) time.Duration {
	t.Helper()
	start := time.Now()
	var last hub.Status
	var lastErr error
	for time.Since(start) < timeout {
		if last, lastErr = c.status(t.Context()); lastErr == nil && allHealthy(last) {
			return time.Since(start)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: not every machine Healthy within %v; last status %+v (err %v)", what, timeout, last, lastErr)
	return 0
}

// TestPartitionLongerThanAMinuteHeals: real processes in network namespaces, the hub and cp-0 cut off
// (iptables) from cp-1 and cp-2 for longer than a minute (HALE_PARTITION_SECONDS, 70 by default). On
// the hub's side: it hears 2 of its 4 expected observers, so it does nothing and says so (a crash of
// cp-1 and cp-2 would look the same), and a real Prometheus beside it fires exactly the alerts of that
// (no majority, not planning, observers missing), all cleared after the heal. After the heal: every observer sees every other again and every
// machine is Healthy within seconds (memberlist alone never rejoins members it declared dead once it
// stops gossiping to them), and no remediation was ever journaled, not even of cp-0, whose etcd had no
// leader for the whole partition.
func TestPartitionLongerThanAMinuteHeals(t *testing.T) {
	hold := 70 * time.Second
	if s := os.Getenv("HALE_PARTITION_SECONDS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err, "HALE_PARTITION_SECONDS")
		hold = time.Duration(n) * time.Second
	}
	c := startCluster(t)
	c.waitHealthy(t, 90*time.Second, "at start")
	// A real Prometheus beside the hub, in its namespace, with the shipped rules (for: 1 s), scraping
	// the hub (the agents serve their metrics on their own loopback).
	promDir := filepath.Join(c.dir, "prometheus")
	require.NoError(t, os.MkdirAll(promDir, 0o700))
	prom := promtest.Start(t, promtest.Options{Dir: promDir, Addr: "127.0.0.1:9090",
		Rules: filepath.Join("..", "..", "deploy", "alerts", "hale.rules.yaml"), Targets: map[string][]string{"hale-hub": {"127.0.0.1:9357"}},
		Start: func(argv ...string) { c.hubH.Start("prometheus", argv...) }, Dial: c.hubH.Dial})
	prom.WaitFiring(30*time.Second, "all well")

	c.lab.Cut([]*Host{c.hubH, c.cps[0]}, []*Host{c.cps[1], c.cps[2]})
	t.Logf("partition: {hub, cp-0} | {cp-1, cp-2} for %v", hold)
	prom.WaitFiring(30*time.Second, "the hub on the minority side", "HaleObserverMajorityLost", "HaleHubNotPlanning", "HaleObserversMissing")
	saidWhy := false
	for end := time.Now().Add(hold); time.Now().Before(end); time.Sleep(time.Second) {
		st, err := c.status(t.Context())
		require.NoError(t, err, "the hub's API, during the partition")
		for _, m := range st.Machines {
			require.Nil(t, m.Remediation, "%s remediated from the minority side: %+v", m.Name, st)
		}
		saidWhy = saidWhy || strings.Contains(st.NotPlanning, "the hub hears 2 of 4 expected observers")
	}
	require.True(t, saidWhy, "the hub never said it hears 2 of 4 observers")

	// The heal comes in two steps, as it often does: first the hub hears cp-1 and cp-2 again (a
	// majority) while cp-0 is still cut off from them, and still fails its own etcd probe as it has
	// for the whole partition; 3 s later cp-0's links come back too. Time without a majority is no
	// evidence: cp-0's probe has not failed for its 10 s timeout since the hub heard a majority again,
	// so cp-0 is not rebooted.
	c.lab.Uncut([]*Host{c.hubH}, []*Host{c.cps[1], c.cps[2]})
	time.Sleep(3 * time.Second)
	c.lab.Heal()
	took := c.waitHealthy(t, 60*time.Second, "after the heal")
	t.Logf("partition of %v healed → every machine Healthy, all 4 observers heard, in %v", hold, took.Round(100*time.Millisecond))
	fmt.Printf("netns partition: %v partition healed → all Healthy in %v\n", hold, took.Round(100*time.Millisecond))
	prom.WaitFiring(30*time.Second, "healed")
	// And nothing happens later either: longer than the probes' timeout (10 s), whose failures on the
	// minority side (cp-0's etcd had no leader) must not count once the partition is over.
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
		st, err := c.status(t.Context())
		require.NoError(t, err)
		for _, m := range st.Machines {
			require.Nil(t, m.Remediation, "%s remediated after the heal: %+v", m.Name, st)
		}
	}

	c.hub.Stop(10 * time.Second)
	j, err := hub.OpenJournal(filepath.Join(c.dir, "journal.db"), 0)
	require.NoError(t, err)
	defer j.Close()
	for i := range 3 {
		hist, err := j.History(t.Context(), fmt.Sprintf("cp-%d", i))
		require.NoError(t, err)
		require.Empty(t, hist, "cp-%d: remediations journaled", i)
	}
}
