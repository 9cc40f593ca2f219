package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hale-dev/hale/bmc/bmcsim"
	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/test/ipmisim"
	"github.com/hale-dev/hale/test/netns"
	"github.com/hale-dev/hale/test/proc"
)

// Shape is the cluster under test: the control-plane machines (each an etcd member, an agent and a
// BMC: Redfish for the first ones, ipmi_sim for the last IPMI of them) and the witness hosts.
type Shape struct {
	Machines, Witnesses, IPMI int
}

// Cooldown is the inventory's cooldown: no two of Hale's power actions on one machine come closer.
const Cooldown = 20 * time.Second

// machine is one control-plane machine: its host, and the processes its power runs.
type machine struct {
	name, member string
	host         *netns.Host
	bmc, creds   string // its BMC's endpoint and credentials file
	c            *cluster

	mu          sync.Mutex
	on          bool
	etcd, agent *proc.Process
}

// cluster is the cluster under test: machines, witnesses, the hub, and the out-of-band host that holds
// the BMCs (the hub reaches them there; a cut between the two is a BMC network fault) and from which
// the checker samples etcd.
type cluster struct {
	t        *run
	lab      *netns.Lab
	bins     netns.Binaries
	dir      string
	machines []*machine
	wits     []*netns.Host
	witProcs []*proc.Process
	hubH     *netns.Host
	oob      *netns.Host
	redfish  *bmcsim.Server
	ipmi     map[string]*ipmisim.Sim
	socket   string
	keyFile  string
	// pinnedFile pins every member's key; identityFile(name) is each one's own.
	pinnedFile string
	joins      []string
	hubArgs    []string

	mu  sync.Mutex
	hub *proc.Process
	// onPowerOff, when set, is called as a machine's BMC takes it down (a fault kills the hub there).
	onPowerOff func(m *machine)
	events     *timeline
}

// policy is added to the inventory's policy (flow style).
func startCluster(t *run, bins netns.Binaries, shape Shape, policy string, events *timeline) *cluster {
	lab := netns.New(t)
	c := &cluster{t: t, lab: lab, bins: bins, dir: t.TempDir(), ipmi: map[string]*ipmisim.Sim{}, events: events}
	c.socket = filepath.Join(c.dir, "hub.sock")
	for i := range shape.Machines {
		m := &machine{name: fmt.Sprintf("cp-%d", i), member: fmt.Sprintf("etcd-%d", i), c: c}
		m.host = lab.Host(m.name)
		c.machines = append(c.machines, m)
	}
	for i := range shape.Witnesses {
		c.wits = append(c.wits, lab.Host(fmt.Sprintf("w-%d", i)))
	}
	c.hubH, c.oob = lab.Host("hub"), lab.Host("oob")

	key := make([]byte, 32)
	for i := range key {
		key[i] = byte(i*11 + 5)
	}
	c.keyFile = c.write("gossip.key", base64.StdEncoding.EncodeToString(key)+"\n")
	for _, m := range c.machines {
		c.joins = append(c.joins, m.host.Addr(7946))
	}
	c.pinIdentities()
	for _, m := range c.machines {
		m.powerOn("start")
	}
	var etcdURLs []string
	for _, m := range c.machines {
		etcdURLs = append(etcdURLs, `"http://`+m.host.Addr(2379)+`"`)
	}
	for _, h := range c.wits {
		cfg := c.write(fmt.Sprintf("agent-%s.yaml", h.Name), fmt.Sprintf(`cluster: chaos
node: %s
role: witness
reportInterval: 1s
listen: 127.0.0.1:9101
gossip: {bind: "%s", join: [%s], keyFile: %s, identityFile: %s, pinnedFile: %s}
etcd: {endpoints: [%s]}
`, h.Name, h.Addr(7946), strings.Join(c.joins, ", "), c.keyFile, c.identityFile(h.Name), c.pinnedFile, strings.Join(etcdURLs, ", ")))
		c.witProcs = append(c.witProcs, h.Start("agent-"+h.Name, bins.Agent, "-config", cfg))
	}
	c.startBMCs(shape, policy)
	c.startHub()
	return c
}

// pinIdentities makes every member's identity key as an operator would (`agent -print-identity`,
// `hub identity`, each creating its key) and writes the pinned-keys file of their lines.
func (c *cluster) pinIdentities() {
	var lines []string
	run := func(args ...string) {
		out, err := exec.Command(args[0], args[1:]...).Output()
		if err != nil {
			c.t.Fatalf("chaos: %s: %v", strings.Join(args, " "), err)
		}
		lines = append(lines, strings.TrimSpace(string(out)))
	}
	for _, m := range c.machines {
		run(c.bins.Agent, "-node", m.name, "-identity-file", c.identityFile(m.name), "-print-identity")
	}
	for _, h := range c.wits {
		run(c.bins.Agent, "-node", h.Name, "-identity-file", c.identityFile(h.Name), "-print-identity")
	}
	run(c.bins.Hub, "identity", "--identity-file", c.identityFile("hub"))
	c.pinnedFile = c.write("pinned-keys", "# every member's key (NAME ed25519:BASE64)\n"+strings.Join(lines, "\n")+"\n")
}

// identityFile is member name's own identity key.
func (c *cluster) identityFile(name string) string {
	return filepath.Join(c.dir, "identity-"+name+".key")
}

// replace writes body to path at once (a new file renamed over it): a member reading it sees the old
// content or the new, never half.
func (c *cluster) replace(path, body string) {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
		c.t.Fatalf("chaos: %v", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		c.t.Fatalf("chaos: %v", err)
	}
}

func (c *cluster) write(name, body string) string {
	p := filepath.Join(c.dir, name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		c.t.Fatalf("chaos: %v", err)
	}
	return p
}

// startBMCs starts the Redfish simulator (for the first machines) on the out-of-band host, listening
// there from inside this process, and one ipmi_sim per IPMI machine (the last ones), each a process on
// that host; their power runs the machines' processes.
func (c *cluster) startBMCs(shape Shape, policy string) {
	creds := c.write("bmc-credentials", "username=admin\npassword=chaos-secret\n")
	nRedfish := len(c.machines) - shape.IPMI
	var ids []string
	for _, m := range c.machines[:nRedfish] {
		ids = append(ids, m.name)
	}
	ln, err := c.oob.Listen("tcp", c.oob.Addr(8000))
	if err != nil {
		c.t.Fatalf("chaos: the Redfish simulator's listener: %v", err)
	}
	cfg := bmcsim.Config{Listener: ln, Username: "admin", Password: "chaos-secret", PlainHTTP: true,
		OnPower: func(id string, running bool) {
			m := c.machine(id)
			if running {
				m.powerOn("Redfish")
			} else {
				m.powerOff("Redfish")
			}
		},
		OnRequest: func(r *http.Request) {
			if r.Method == http.MethodPost && strings.Contains(r.URL.Path, "Reset") {
				c.events.add("bmc-request", strings.TrimPrefix(r.URL.Path, "/redfish/v1/Systems/"), "POST")
			}
		}}
	for _, id := range ids {
		cfg.Systems = append(cfg.Systems, bmcsim.SystemConfig{ID: id, PowerOnDelay: 200 * time.Millisecond,
			ShutdownDelay: 200 * time.Millisecond, CycleOffDuration: 200 * time.Millisecond})
	}
	if len(ids) > 0 {
		if c.redfish, err = bmcsim.Start(cfg); err != nil {
			c.t.Fatalf("chaos: the Redfish simulator: %v", err)
		}
		c.t.Cleanup(func() { _ = c.redfish.Close() })
	}
	for i, m := range c.machines[nRedfish:] {
		dir := filepath.Join(c.dir, "ipmi-"+m.name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			c.t.Fatalf("chaos: %v", err)
		}
		sim, err := ipmisim.StartAt(dir, ipmisim.Options{Host: c.oob.IP, Port: 6230 + i, Wrap: []string{"ip", "netns", "exec", c.oob.NS}})
		if err != nil {
			c.t.Fatalf("chaos: ipmi_sim for %s: %v", m.name, err)
		}
		c.ipmi[m.name] = sim
		c.write("ipmi-credentials-"+m.name, fmt.Sprintf("username=%s\npassword=%s\n", sim.Username, sim.Password))
		c.followIPMI(m, sim)
	}
	var inv strings.Builder
	if policy != "" {
		policy = ", " + policy
	}
	fmt.Fprintf(&inv, "cluster: chaos\npolicy: {cooldown: %s%s}\nclasses: {cp: {strategy: reboot}}\n", Cooldown, policy)
	if len(c.wits) > 0 {
		var names []string
		for _, h := range c.wits {
			names = append(names, h.Name)
		}
		fmt.Fprintf(&inv, "witnesses: [%s]\n", strings.Join(names, ", "))
	}
	inv.WriteString("machines:\n")
	for _, m := range c.machines {
		ep, file := fmt.Sprintf("redfish+http://%s/systems/%s", c.oob.Addr(8000), m.name), creds
		if sim := c.ipmi[m.name]; sim != nil {
			ep, file = fmt.Sprintf("ipmi://%s:%d", sim.Host, sim.Port), filepath.Join(c.dir, "ipmi-credentials-"+m.name)
		}
		m.bmc, m.creds = ep, file
		fmt.Fprintf(&inv, "  - {name: %s, member: %s, class: cp, bmc: {endpoint: %q, credentials: %s}}\n", m.name, m.member, ep, file)
	}
	inventory := c.write("inventory.yaml", inv.String())
	c.hubArgs = []string{c.bins.Hub, "run", "--inventory", inventory, "--gossip-key-file", c.keyFile, "--join", strings.Join(c.joins, ","),
		"--gossip-bind", c.hubH.Addr(7947), "--journal", filepath.Join(c.dir, "journal.db"), "--socket", c.socket,
		"--metrics-address", "127.0.0.1:9357", "--identity-file", c.identityFile("hub"), "--pinned-file", c.pinnedFile}
}

// followIPMI runs m's power from its ipmi_sim's chassis log: power 0 stops the machine, power 1 starts
// it, reset 1 (a hard reset) does both, shutdown 1 stops it once its power is off.
func (c *cluster) followIPMI(m *machine, sim *ipmisim.Sim) {
	stop := make(chan struct{})
	done := make(chan struct{})
	c.t.Cleanup(func() { close(stop); <-done; sim.Stop() })
	go func() {
		defer close(done)
		seen, soft := 0, false
		for {
			actions := sim.Actions()
			for _, a := range actions[seen:] {
				switch a {
				case "power 0":
					m.powerOff("IPMI")
				case "power 1":
					m.powerOn("IPMI")
				case "reset 1":
					m.powerOff("IPMI reset")
					m.powerOn("IPMI reset")
				}
				soft = a == "shutdown 1" // the OS shuts down: the power goes off 200 ms later
			}
			seen = len(actions)
			if soft && !sim.Power() {
				m.powerOff("IPMI soft off")
				soft = false
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
}

func (c *cluster) machine(name string) *machine {
	for _, m := range c.machines {
		if m.name == name {
			return m
		}
	}
	c.t.Fatalf("chaos: no machine %s", name)
	return nil
}

// startHub starts (or restarts) the real `hub run`, with its journal where the last one left it.
func (c *cluster) startHub() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hub = c.hubH.Start("hub", c.hubArgs...)
}

// killHub kills the running hub and returns it (nil when none runs: another fault holds it down).
func (c *cluster) killHub() *proc.Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.hub == nil || !c.hub.Running() {
		return nil
	}
	c.hub.Signal(syscall.SIGKILL)
	return c.hub
}

// restartHub starts the hub again after old (from killHub) ended, unless something else started one
// meanwhile: two faults that overlap must not leave two hubs, or a harness that watches the one that
// lost the race for the journal.
func (c *cluster) restartHub(old *proc.Process) bool {
	if old == nil {
		return false
	}
	<-old.Done()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.hub != old {
		return false
	}
	c.hub = c.hubH.Start("hub", c.hubArgs...)
	return true
}

// witness is witness host name's agent process.
func (c *cluster) witness(name string) *proc.Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, h := range c.wits {
		if h.Name == name {
			return c.witProcs[i]
		}
	}
	return nil
}

// restartWitness starts witness name's agent again.
func (c *cluster) restartWitness(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, h := range c.wits {
		if h.Name == name {
			c.witProcs[i] = h.Start("agent-"+name, c.witProcs[i].Args()...)
		}
	}
}

func (c *cluster) hubProc() *proc.Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hub
}

// powerOn starts the machine's etcd member (with the data dir it had) and its agent.
func (m *machine) powerOn(by string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.on {
		return
	}
	c := m.c
	var initial []string
	for _, o := range c.machines {
		initial = append(initial, fmt.Sprintf("%s=http://%s", o.member, o.host.Addr(2380)))
	}
	h := m.host
	m.etcd = h.Start(m.member, c.bins.Etcd, "--name", m.member, "--data-dir", filepath.Join(c.dir, m.member),
		"--listen-client-urls", "http://"+h.Addr(2379), "--advertise-client-urls", "http://"+h.Addr(2379),
		"--listen-peer-urls", "http://"+h.Addr(2380), "--initial-advertise-peer-urls", "http://"+h.Addr(2380),
		"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new", "--initial-cluster-token", "chaos")
	cfg := c.write("agent-"+m.name+".yaml", c.agentConfig(m.name, h.Addr(7946), c.identityFile(m.name), "http://"+h.Addr(2379), "127.0.0.1:9101"))
	m.agent = h.Start("agent-"+m.name, c.bins.Agent, "-config", cfg)
	m.on = true
	c.events.add("power-on", m.name, by)
}

// agentConfig is a machine's agent configuration: its name, gossip address, identity key, etcd member
// and metrics address.
func (c *cluster) agentConfig(node, gossip, identity, etcd, listen string) string {
	return fmt.Sprintf(`cluster: chaos
node: %s
reportInterval: 1s
listen: %s
gossip: {bind: "%s", join: [%s], keyFile: %s, identityFile: %s, pinnedFile: %s}
etcd: {endpoint: "%s"}
probes: {kubelet: {enabled: false}, apiserver: {enabled: false}, etcdDisk: {enabled: false}}
`, node, listen, gossip, strings.Join(c.joins, ", "), c.keyFile, identity, c.pinnedFile, etcd)
}

// hubRejected reads the hub's count of refused gossip messages by reason from its /metrics.
func (c *cluster) hubRejected(ctx context.Context) map[string]int {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: c.hubH.Dial, DisableKeepAlives: true}}
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

// powerOff kills every process of the machine at once, as a power cut does.
func (m *machine) powerOff(by string) {
	m.mu.Lock()
	if !m.on {
		m.mu.Unlock()
		return
	}
	m.on = false
	m.c.events.add("power-off", m.name, by)
	hook := m.c.onPowerOff
	for _, p := range []*proc.Process{m.etcd, m.agent} {
		p.Signal(syscall.SIGKILL)
		<-p.Done()
	}
	m.mu.Unlock()
	if hook != nil {
		hook(m)
	}
}

// procs returns the machine's running processes (none while it is off).
func (m *machine) procs() (etcd, agent *proc.Process, on bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.etcd, m.agent, m.on
}

// status is the hub's status (hub status -o json).
func (c *cluster) status(ctx context.Context) (hub.Status, error) {
	var st hub.Status
	out, err := c.hubCommand(ctx, "status", "-o", "json")
	if err != nil {
		return st, fmt.Errorf("hub status: %w: %s", err, firstLine(out))
	}
	return st, json.Unmarshal([]byte(out), &st)
}

// hubCommand runs `hub ARGS --socket S` from outside the lab (the socket is a path) and returns its
// combined output.
func (c *cluster) hubCommand(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bins.Hub, append(args, "--socket", c.socket)...)
	cmd.Env = append(os.Environ(), "USER=chaos")
	out, err := cmd.CombinedOutput()
	return string(out), err
}
