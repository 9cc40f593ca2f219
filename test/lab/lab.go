// Package lab is a cluster of machines in network namespaces (test/netns): each control-plane
// Machine a host with a real etcd member and a real agent whose power is its BMC's (the project's
// Redfish simulator, or ipmi_sim), witness hosts with their agents, a hub host running the real `hub
// run`, and an out-of-band host holding the BMCs. Every member has its own identity key, made with the
// real CLIs; optionally a real kube-apiserver on the members (StartAPIServer). The chaos runs, the
// partition test and the quorum-loss tests (test/quorumlost) share it; test/kubeadm's real cluster
// (StartKube) shares its hosts, BMCs and power.
package lab

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/hale-dev/hale/bmc/bmcsim"
	"github.com/hale-dev/hale/hub/operator"
	"github.com/hale-dev/hale/test/ipmisim"
	"github.com/hale-dev/hale/test/lab/power"
	"github.com/hale-dev/hale/test/netns"
	"github.com/hale-dev/hale/test/proc"
	"github.com/hale-dev/hale/test/staticpod"
)

// Shape is the cluster under test: the control-plane machines (each an etcd member, an agent and a
// BMC: Redfish for the first ones, ipmi_sim for the last IPMI of them) and the witness hosts.
type Shape struct {
	Machines, Witnesses, IPMI int
}

// Cooldown is the inventory's cooldown: no two of Hale's power actions on one machine come closer.
const Cooldown = 20 * time.Second

// Machine is one control-plane machine: its host, and the processes its power runs.
type Machine struct {
	Name, Member string
	Host         *netns.Host
	BMC, Creds   string // its BMC's endpoint and credentials file
	c            *Cluster

	// Manifest and StateDir, with Options.StaticPods: its etcd's static pod manifest (a kubelet stand-in
	// runs it while the machine is on) and the state directory of `agent recover` and `agent rejoin`.
	Manifest, StateDir string
	kubelet            *staticpod.Kubelet

	mu          sync.Mutex
	on          bool
	broken      bool // BreakForGood: powered on, nothing boots
	frozen      bool // Freeze: stopped and cut off until Thaw or a power-off
	etcd, agent *proc.Process
}

// Cluster is the cluster under test: machines, witnesses, the hub, and the out-of-band host that holds
// the BMCs (the hub reaches them there; a cut between the two is a BMC network fault, and a test's
// checker can sample etcd from there).
type Cluster struct {
	T         netns.TB // the test (or chaos run) it belongs to
	Lab       *netns.Lab
	Bins      netns.Binaries
	Dir       string
	Machines  []*Machine
	Witnesses []*netns.Host
	witProcs  []*proc.Process
	HubHost   *netns.Host
	OOB       *netns.Host
	Redfish   *bmcsim.Server
	IPMI      map[string]*ipmisim.Sim
	Socket    string
	KeyFile   string
	// PinnedFile pins every member's key; IdentityFile(name) is each one's own.
	PinnedFile string
	Joins      []string
	// Cooldown is the inventory's cooldown (Options.Cooldown).
	Cooldown time.Duration
	// HubArgs is the hub's command line (the binary first): a standalone hub with the lab's inventory,
	// journal and socket. A test may change it before StartHub (Kubernetes mode, say).
	HubArgs []string

	mu  sync.Mutex
	hub *proc.Process
	// OnPowerOff, when set (before anything can power a machine off), is called as a machine's BMC
	// takes it down (a chaos fault kills the hub there).
	OnPowerOff func(m *Machine)
	onEvent    func(kind, target, detail string)
}

// ActSoon is a policy (Options.Policy) that acts on a machine 2 s after it shows no sign of life, or
// its component fails: for tests of what follows a verdict, where the shipped waits (30 s, 3 min)
// would only cost minutes; the stall matrix runs those.
const ActSoon = "stallTolerance: {quorumHeld: 2s, quorumNeeded: 2s}, componentGrace: {quorumHeld: 2s, quorumNeeded: 2s}"

// Options are a cluster's settings beyond its shape.
type Options struct {
	// Policy is added to the inventory's policy (flow style, e.g. "maxAttempts: 2").
	Policy string
	// OnEvent, when set, is told of every power change ("power-on", "power-off": by whom) and every
	// Redfish reset request ("bmc-request").
	OnEvent func(kind, target, detail string)
	// StaticPods runs each machine's etcd as kubeadm does, from a static pod manifest (Machine.Manifest)
	// while the machine is on, so that `agent recover` and `agent rejoin` can run there. A member that
	// exits is started again, as a kubelet does.
	StaticPods bool
	// HubArgs are added to `hub run`'s arguments.
	HubArgs []string
	// NoHub leaves the hub to the test (StartHub, with Cluster.HubArgs as it wants them).
	NoHub bool
	// PowerOn is how long a Redfish BMC takes to power its machine on (default 200 ms).
	PowerOn time.Duration
	// Cooldown is the inventory's cooldown (default Cooldown).
	Cooldown time.Duration
}

// Start starts a cluster of shape: its hosts, every member's identity, the machines powered on, the
// witnesses' agents, the BMCs and the hub. It stops when t ends.
func Start(t netns.TB, bins netns.Binaries, shape Shape, o Options) *Cluster {
	lab := netns.New(t)
	c := &Cluster{T: t, Lab: lab, Bins: bins, Dir: t.TempDir(), IPMI: map[string]*ipmisim.Sim{}, onEvent: o.OnEvent}
	c.Socket = filepath.Join(c.Dir, "hub.sock")
	for i := range shape.Machines {
		m := &Machine{Name: fmt.Sprintf("cp-%d", i), Member: fmt.Sprintf("etcd-%d", i), c: c}
		m.Host = lab.Host(m.Name)
		c.Machines = append(c.Machines, m)
	}
	for i := range shape.Witnesses {
		c.Witnesses = append(c.Witnesses, lab.Host(fmt.Sprintf("w-%d", i)))
	}
	c.HubHost, c.OOB = lab.Host("hub"), lab.Host("oob")

	key := make([]byte, 32)
	for i := range key {
		key[i] = byte(i*11 + 5)
	}
	c.KeyFile = c.Write("gossip.key", base64.StdEncoding.EncodeToString(key)+"\n")
	for _, m := range c.Machines {
		c.Joins = append(c.Joins, m.Host.Addr(7946))
	}
	c.pinIdentities()
	if o.StaticPods {
		c.staticPods()
	}
	for _, m := range c.Machines {
		m.PowerOn("start")
	}
	var etcdURLs []string
	for _, m := range c.Machines {
		etcdURLs = append(etcdURLs, `"http://`+m.Host.Addr(2379)+`"`)
	}
	for _, h := range c.Witnesses {
		cfg := c.Write(fmt.Sprintf("agent-%s.yaml", h.Name), fmt.Sprintf(`cluster: lab
node: %s
role: witness
reportInterval: 1s
listen: %s
gossip: {bind: "%s", join: [%s], keyFile: %s, identityFile: %s, pinnedFile: %s}
etcd: {endpoints: [%s]}
`, h.Name, h.Addr(9101), h.Addr(7946), strings.Join(c.Joins, ", "), c.KeyFile, c.IdentityFile(h.Name), c.PinnedFile, strings.Join(etcdURLs, ", ")))
		c.witProcs = append(c.witProcs, h.Start("agent-"+h.Name, bins.Agent, "-config", cfg))
	}
	c.Cooldown = cmp.Or(o.Cooldown, Cooldown)
	c.startBMCs(shape, o.Policy, cmp.Or(o.PowerOn, 200*time.Millisecond))
	c.HubArgs = append(c.HubArgs, o.HubArgs...)
	if !o.NoHub {
		c.StartHub()
	}
	return c
}

// staticPods writes each machine's etcd manifest and starts its kubelet stand-in, powered off.
func (c *Cluster) staticPods() {
	for _, m := range c.Machines {
		m.Manifest = filepath.Join(c.Dir, m.Name, "manifests", "etcd.yaml")
		m.StateDir = filepath.Join(c.Dir, m.Name, "recovery")
		err := staticpod.WriteManifest(m.Manifest, staticpod.Etcd{Name: m.Member, DataDir: m.dataDir(), Client: "http://" + m.Host.Addr(2379),
			Peer: "http://" + m.Host.Addr(2380), Initial: c.initialCluster(), State: "new", Token: "lab"})
		if err != nil {
			c.T.Fatalf("lab: %s's etcd manifest: %v", m.Name, err)
		}
		m.kubelet = staticpod.New(c.T, c.Bins.Etcd, m.Member, m.Manifest, m.Host.Start)
	}
}

// initialCluster is every member's --initial-cluster entry, as the cluster was first started.
func (c *Cluster) initialCluster() string {
	var initial []string
	for _, o := range c.Machines {
		initial = append(initial, fmt.Sprintf("%s=http://%s", o.Member, o.Host.Addr(2380)))
	}
	return strings.Join(initial, ",")
}

// dataDir is the machine's etcd data directory.
func (m *Machine) dataDir() string { return filepath.Join(m.c.Dir, m.Member) }

// LostForGood is the power-off event's detail (Options.OnEvent) of a machine lost for good: no BMC's.
const LostForGood = "lost for good"

// LoseForGood kills the machine for good: its power supply fails (its BMC, which must be the Redfish
// simulator, reads it Off and cannot power it on) and its disk with its etcd data.
func (m *Machine) LoseForGood() {
	c := m.c
	if c.Redfish == nil || c.IPMI[m.Name] != nil {
		c.T.Fatalf("lab: %s's BMC is not the Redfish simulator: its power cannot be made to fail", m.Name)
	}
	c.Redfish.SetDead(m.Name, true)
	m.PowerOff(LostForGood)
	c.Redfish.SetPowerState(m.Name, bmcsim.Off)
	m.wipe()
}

// BreakForGood kills the machine for good another way: its board dies and its disk with it. Its BMC
// still answers, reads it On and powers it on and off; nothing boots.
func (m *Machine) BreakForGood() {
	m.mu.Lock()
	m.broken = true
	m.mu.Unlock()
	m.PowerOff(LostForGood)
	m.wipe()
}

// wipe removes the machine's etcd data: its disk is gone.
func (m *Machine) wipe() {
	if err := os.RemoveAll(m.dataDir()); err != nil {
		m.c.T.Fatalf("lab: wiping %s's disk: %v", m.Name, err)
	}
}

// Replace puts a new machine in the place of one lost for good: the same name, BMC, addresses and
// manifest, a working board and power supply and an empty disk. It stays off until powered on.
func (m *Machine) Replace() {
	if m.c.Redfish != nil && m.c.IPMI[m.Name] == nil {
		m.c.Redfish.SetDead(m.Name, false)
	}
	m.mu.Lock()
	m.broken = false
	m.mu.Unlock()
}

// pinIdentities makes every member's identity key as an operator would (`agent -print-identity`,
// `hub identity`, each creating its key) and writes the pinned-keys file of their lines.
func (c *Cluster) pinIdentities() {
	var lines []string
	run := func(args ...string) {
		out, err := exec.Command(args[0], args[1:]...).Output()
		if err != nil {
			c.T.Fatalf("lab: %s: %v", strings.Join(args, " "), err)
		}
		lines = append(lines, strings.TrimSpace(string(out)))
	}
	for _, m := range c.Machines {
		run(c.Bins.Agent, "-node", m.Name, "-identity-file", c.IdentityFile(m.Name), "-print-identity")
	}
	for _, h := range c.Witnesses {
		run(c.Bins.Agent, "-node", h.Name, "-identity-file", c.IdentityFile(h.Name), "-print-identity")
	}
	run(c.Bins.Hub, "identity", "--identity-file", c.IdentityFile("hub"))
	c.PinnedFile = c.Write("pinned-keys", "# every member's key (NAME ed25519:BASE64)\n"+strings.Join(lines, "\n")+"\n")
}

// IdentityFile is member name's own identity key.
func (c *Cluster) IdentityFile(name string) string {
	return filepath.Join(c.Dir, "identity-"+name+".key")
}

// Replace writes body to path at once (a new file renamed over it): a member reading it sees the old
// content or the new, never half.
func (c *Cluster) Replace(path, body string) {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
		c.T.Fatalf("lab: %v", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		c.T.Fatalf("lab: %v", err)
	}
}

func (c *Cluster) Write(name, body string) string {
	p := filepath.Join(c.Dir, name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		c.T.Fatalf("lab: %v", err)
	}
	return p
}

// startBMCs starts the Redfish simulator (for the first machines) on the out-of-band host, listening
// there from inside this process, and one ipmi_sim per IPMI machine (the last ones), each a process on
// that host; their power runs the machines' processes.
func (c *Cluster) startBMCs(shape Shape, policy string, powerOn time.Duration) {
	creds := c.Write("bmc-credentials", "username=admin\npassword=lab-secret\n")
	nRedfish := len(c.Machines) - shape.IPMI
	var ids []string
	for _, m := range c.Machines[:nRedfish] {
		ids = append(ids, m.Name)
	}
	c.Redfish = startRedfish(c.T, c.OOB, ids, powerOn, func(id string) power.Machine { return c.Machine(id) }, c.event)
	for i, m := range c.Machines[nRedfish:] {
		dir := filepath.Join(c.Dir, "ipmi-"+m.Name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			c.T.Fatalf("lab: %v", err)
		}
		sim, err := ipmisim.StartAt(dir, ipmisim.Options{Host: c.OOB.IP, Port: 6230 + i, Wrap: []string{"ip", "netns", "exec", c.OOB.NS}})
		if err != nil {
			c.T.Fatalf("lab: ipmi_sim for %s: %v", m.Name, err)
		}
		c.IPMI[m.Name] = sim
		c.Write("ipmi-credentials-"+m.Name, fmt.Sprintf("username=%s\npassword=%s\n", sim.Username, sim.Password))
		followIPMI(c.T, m, sim)
	}
	var inv strings.Builder
	if policy != "" {
		policy = ", " + policy
	}
	fmt.Fprintf(&inv, "cluster: lab\npolicy: {cooldown: %s%s}\nclasses: {cp: {strategy: reboot}}\n", c.Cooldown, policy)
	if len(c.Witnesses) > 0 {
		var names []string
		for _, h := range c.Witnesses {
			names = append(names, h.Name)
		}
		fmt.Fprintf(&inv, "witnesses: [%s]\n", strings.Join(names, ", "))
	}
	inv.WriteString("machines:\n")
	for _, m := range c.Machines {
		ep, file := fmt.Sprintf("redfish+http://%s/systems/%s", c.OOB.Addr(8000), m.Name), creds
		if sim := c.IPMI[m.Name]; sim != nil {
			ep, file = fmt.Sprintf("ipmi://%s:%d", sim.Host, sim.Port), filepath.Join(c.Dir, "ipmi-credentials-"+m.Name)
		}
		m.BMC, m.Creds = ep, file
		fmt.Fprintf(&inv, "  - {name: %s, member: %s, class: cp, bmc: {endpoint: %q, credentials: %s}}\n", m.Name, m.Member, ep, file)
	}
	inventory := c.Write("inventory.yaml", inv.String())
	c.HubArgs = []string{c.Bins.Hub, "run", "--inventory", inventory, "--gossip-key-file", c.KeyFile, "--join", strings.Join(c.Joins, ","),
		"--gossip-bind", c.HubHost.Addr(7947), "--journal", filepath.Join(c.Dir, "journal.db"), "--socket", c.Socket,
		"--metrics-address", "127.0.0.1:9357", "--identity-file", c.IdentityFile("hub"), "--pinned-file", c.PinnedFile}
}

// startRedfish starts the Redfish simulator (login admin / lab-secret, plain HTTP) on oob's port 8000,
// listening there from inside this process, with one system per id whose power runs machine(id)'s
// (powering one on takes powerOn), each reset request told to event ("bmc-request"). Nil when ids is
// empty. It stops when t ends.
func startRedfish(t netns.TB, oob *netns.Host, ids []string, powerOn time.Duration, machine func(id string) power.Machine, event func(kind, target, detail string)) *bmcsim.Server {
	if len(ids) == 0 {
		return nil
	}
	ln, err := oob.Listen("tcp", oob.Addr(8000))
	if err != nil {
		t.Fatalf("lab: the Redfish simulator's listener: %v", err)
	}
	cfg := bmcsim.Config{Listener: ln, Username: "admin", Password: "lab-secret", PlainHTTP: true,
		OnPower: power.Redfish(machine),
		OnRequest: func(r *http.Request) {
			if r.Method == http.MethodPost && strings.Contains(r.URL.Path, "Reset") {
				event("bmc-request", strings.TrimPrefix(r.URL.Path, "/redfish/v1/Systems/"), "POST")
			}
		}}
	for _, id := range ids {
		cfg.Systems = append(cfg.Systems, bmcsim.SystemConfig{ID: id, PowerOnDelay: powerOn,
			ShutdownDelay: 200 * time.Millisecond, CycleOffDuration: 200 * time.Millisecond})
	}
	sim, err := bmcsim.Start(cfg)
	if err != nil {
		t.Fatalf("lab: the Redfish simulator: %v", err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	return sim
}

// followIPMI runs m's power from its ipmi_sim's chassis log until t ends, then stops ipmi_sim.
func followIPMI(t netns.TB, m power.Machine, sim *ipmisim.Sim) {
	stop := power.FollowIPMI(m, sim)
	t.Cleanup(func() { stop(); sim.Stop() })
}

func (c *Cluster) Machine(name string) *Machine {
	for _, m := range c.Machines {
		if m.Name == name {
			return m
		}
	}
	c.T.Fatalf("lab: no machine %s", name)
	return nil
}

// StartHub starts (or restarts) the real `hub run`, with its journal where the last one left it.
func (c *Cluster) StartHub() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hub = c.HubHost.Start("hub", c.HubArgs...)
}

// KillHub kills the running hub and returns it (nil when none runs: another fault holds it down).
func (c *Cluster) KillHub() *proc.Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.hub == nil || !c.hub.Running() {
		return nil
	}
	c.hub.Signal(syscall.SIGKILL)
	return c.hub
}

// RestartHub starts the hub again after old (from killHub) ended, unless something else started one
// meanwhile: two faults that overlap must not leave two hubs, or a harness that watches the one that
// lost the race for the journal.
func (c *Cluster) RestartHub(old *proc.Process) bool {
	if old == nil {
		return false
	}
	<-old.Done()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.hub != old {
		return false
	}
	c.hub = c.HubHost.Start("hub", c.HubArgs...)
	return true
}

// Witness is witness host name's agent process.
func (c *Cluster) Witness(name string) *proc.Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, h := range c.Witnesses {
		if h.Name == name {
			return c.witProcs[i]
		}
	}
	return nil
}

// RestartWitness starts witness name's agent again.
func (c *Cluster) RestartWitness(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, h := range c.Witnesses {
		if h.Name == name {
			c.witProcs[i] = h.Start("agent-"+name, c.witProcs[i].Args()...)
		}
	}
}

func (c *Cluster) HubProc() *proc.Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hub
}

// PowerOn starts the machine's etcd member (with the data dir it had) and its agent.
func (m *Machine) PowerOn(by string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.on || m.broken {
		return
	}
	c := m.c
	h := m.Host
	if m.kubelet != nil {
		m.kubelet.PowerOn()
	} else {
		m.etcd = h.Start(m.Member, c.Bins.Etcd, "--name", m.Member, "--data-dir", m.dataDir(),
			"--listen-client-urls", "http://"+h.Addr(2379), "--advertise-client-urls", "http://"+h.Addr(2379),
			"--listen-peer-urls", "http://"+h.Addr(2380), "--initial-advertise-peer-urls", "http://"+h.Addr(2380),
			"--initial-cluster", c.initialCluster(), "--initial-cluster-state", "new", "--initial-cluster-token", "lab",
			// No fsync (as test/etcdcluster's members): the run's other writers (the real cluster's
			// nodes) stalled fsyncs for seconds, and a raft loop blocked there serves nothing. A power
			// cut here stops the process; what it wrote stays in the page cache.
			"--unsafe-no-fsync")
	}
	cfg := c.Write("agent-"+m.Name+".yaml", c.AgentConfig(m.Name, h.Addr(7946), c.IdentityFile(m.Name), "http://"+h.Addr(2379), h.Addr(9101)))
	m.agent = h.Start("agent-"+m.Name, c.Bins.Agent, "-config", cfg)
	m.on = true
	c.event("power-on", m.Name, by)
}

// AgentConfig is a machine's agent configuration: its name, gossip address, identity key, etcd member
// and metrics address.
func (c *Cluster) AgentConfig(node, gossip, identity, etcd, listen string) string {
	return fmt.Sprintf(`cluster: lab
node: %s
reportInterval: 1s
listen: %s
gossip: {bind: "%s", join: [%s], keyFile: %s, identityFile: %s, pinnedFile: %s}
etcd: {endpoint: "%s"}
probes: {kubelet: {enabled: false}, apiserver: {enabled: false}, etcdDisk: {enabled: false}}
`, node, listen, gossip, strings.Join(c.Joins, ", "), c.KeyFile, identity, c.PinnedFile, etcd)
}

// EtcdStatus is m's etcd member's own status (its member ID, its leader, its raft term), asked from
// the out-of-band host.
func (c *Cluster) EtcdStatus(ctx context.Context, m *Machine) (*clientv3.StatusResponse, error) {
	cli, err := c.EtcdClient(m)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return cli.Status(ctx, "http://"+m.Host.Addr(2379))
}

// EtcdClient is a client of m's etcd member alone, from the out-of-band host.
func (c *Cluster) EtcdClient(m *Machine) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: []string{"http://" + m.Host.Addr(2379)}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return c.OOB.Dial(ctx, "tcp", addr)
		})}})
}

// MoveLeader makes m's etcd member the leader (etcd's transfer of leadership, asked of the leader
// from the out-of-band host), as an etcd leader on one side of a partition is.
func (c *Cluster) MoveLeader(ctx context.Context, m *Machine) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		var to uint64
		var leader *Machine
		for _, o := range c.Machines {
			st, err := c.EtcdStatus(ctx, o)
			if err == nil && st.Leader == st.Header.MemberId {
				leader = o
			}
			if err == nil && o == m {
				to = st.Header.MemberId
			}
		}
		switch {
		case leader == m:
			return nil
		case to != 0 && leader != nil:
			cli, err := c.EtcdClient(leader)
			if err != nil {
				return err
			}
			_, err = cli.MoveLeader(ctx, to)
			_ = cli.Close()
			if err != nil {
				return fmt.Errorf("moving etcd's leadership to %s: %w", m.Member, err)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("moving etcd's leadership to %s: %w", m.Member, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// HubRejected reads the hub's count of refused gossip messages by reason from its /metrics.
func (c *Cluster) HubRejected(ctx context.Context) map[string]int {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: c.HubHost.Dial, DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:9357/metrics", nil)
	if err != nil {
		return nil
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	out := map[string]int{}
	for _, line := range strings.Split(string(body), "\n") {
		rest, ok := strings.CutPrefix(line, `hale_hub_gossip_rejected_total{reason="`)
		if !ok {
			continue
		}
		reason, n, _ := strings.Cut(rest, `"} `)
		var v float64
		if _, err := fmt.Sscan(n, &v); err == nil && v > 0 {
			out[reason] = int(v)
		}
	}
	return out
}

// PowerOff kills every process of the machine at once, as a power cut does.
func (m *Machine) PowerOff(by string) {
	m.mu.Lock()
	if !m.on {
		m.mu.Unlock()
		return
	}
	m.on = false
	m.c.event("power-off", m.Name, by)
	m.thawLocked() // (its processes are killed below: what it was doing is gone)
	hook := m.c.OnPowerOff
	if m.kubelet != nil {
		m.kubelet.PowerOff()
	}
	for _, p := range []*proc.Process{m.etcd, m.agent} {
		if p != nil {
			p.Signal(syscall.SIGKILL)
			<-p.Done()
		}
	}
	m.mu.Unlock()
	if hook != nil {
		hook(m)
	}
}

// Hang freezes the machine's etcd member and agent (SIGSTOP): they stop answering, its power stays
// on. Its power going off still stops them; going on again boots them.
func (m *Machine) Hang() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.on {
		return
	}
	m.signalLocked(syscall.SIGSTOP)
}

// Resume thaws a machine Hang froze (SIGCONT): it goes on by itself, with no BMC call.
func (m *Machine) Resume() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.signalLocked(syscall.SIGCONT)
}

// KillEtcd stops the machine's etcd member alone (a crashed or hung member, its agent reporting it);
// it runs again when the machine is powered on. The machine must run its etcd as a static pod
// (Options.StaticPods).
func (m *Machine) KillEtcd() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.staticPod().PowerOff()
}

// SignalEtcd sends the machine's etcd member sig (SIGSTOP: it hangs, as on a stalled disk; SIGCONT:
// it goes on), its agent left running.
func (m *Machine) SignalEtcd(sig syscall.Signal) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.kubelet != nil {
		m.kubelet.Signal(sig)
	} else if m.etcd != nil {
		m.etcd.Signal(sig)
	}
}

func (m *Machine) staticPod() *staticpod.Kubelet {
	if m.kubelet == nil {
		m.c.T.Fatalf("lab: %s runs no static pod (Options.StaticPods)", m.Name)
	}
	return m.kubelet
}

// RestartAgent kills the machine's agent and, after between returns, starts it again, unless the
// machine's power did that meanwhile; it says whether it did (false too when the machine is off).
func (m *Machine) RestartAgent(between func()) bool {
	m.mu.Lock()
	if !m.on {
		m.mu.Unlock()
		return false
	}
	old := m.agent
	old.Signal(syscall.SIGKILL)
	m.mu.Unlock()
	between()
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.on || m.agent != old {
		return false
	}
	m.agent = m.Host.Start("agent-"+m.Name, old.Args()...)
	return true
}

// Procs returns the machine's running processes (none while it is off).
func (m *Machine) Procs() (etcd, agent *proc.Process, on bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	etcd = m.etcd
	if m.kubelet != nil {
		etcd = m.kubelet.Process()
	}
	return etcd, m.agent, m.on
}

// Status is the hub's status (hub status -o json).
func (c *Cluster) Status(ctx context.Context) (operator.Status, error) {
	var st operator.Status
	out, err := c.HubCommand(ctx, "status", "-o", "json")
	if err != nil {
		return st, fmt.Errorf("hub status: %w: %s", err, firstLine(out))
	}
	return st, json.Unmarshal([]byte(out), &st)
}

// HubCommand runs `hub ARGS --socket S` from outside the lab (the socket is a path) and returns its
// combined output.
func (c *Cluster) HubCommand(ctx context.Context, args ...string) (string, error) {
	cmd, cancel := c.hubCommand(ctx, args)
	defer cancel()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// HubOutput runs `hub ARGS --socket S` like HubCommand, and returns its standard output alone (a
// document, with -o json); its error carries the standard error.
func (c *Cluster) HubOutput(ctx context.Context, args ...string) (string, error) {
	cmd, cancel := c.hubCommand(ctx, args)
	defer cancel()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// hubCommand is `hub ARGS --socket S`, run from outside the lab within 90 s (cancel ends it).
func (c *Cluster) hubCommand(ctx context.Context, args []string) (*exec.Cmd, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	cmd := exec.CommandContext(ctx, c.Bins.Hub, append(args, "--socket", c.Socket)...)
	cmd.Env = append(os.Environ(), "USER=lab")
	return cmd, cancel
}

// event tells the cluster's user of a power change or a BMC request.
func (c *Cluster) event(kind, target, detail string) {
	if c.onEvent != nil {
		c.onEvent(kind, target, detail)
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}
