// Package inproc is test/lab's in-process backend: a cluster in one process, rootless and up in
// seconds. A 3-member embedded etcd cluster, three machines each with a real agent (real probes, real
// gossip on loopback) and a simulated BMC (the Redfish simulator, or ipmi_sim) whose power starts and
// stops that machine's etcd member and agent (test/lab/power, as in the namespace backend), two
// witnesses and a real hub with a bbolt journal. The demo (cmd/hale-demo, test/demo) runs its
// scenarios on it and narrates a timeline; kube's and cmd/hub's tests use it as their cluster.
package inproc

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/bmc/bmcsim"
	"github.com/hale-dev/hale/health"
	"github.com/hale-dev/hale/health/identity"
	"github.com/hale-dev/hale/hub"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/execute"
	"github.com/hale-dev/hale/hub/journal"
	"github.com/hale-dev/hale/hub/journal/boltfile"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
	"github.com/hale-dev/hale/recovery"
	"github.com/hale-dev/hale/test/etcdcluster"
	"github.com/hale-dev/hale/test/ipmisim"
	"github.com/hale-dev/hale/test/lab/power"
	"github.com/hale-dev/hale/test/lossy"
	"github.com/hale-dev/hale/test/partition"
)

// Machines is how many machines the cluster has; Witnesses how many witness agents (on hosts that are
// not machines: they observe and vote, and read etcd from outside).
const (
	Machines  = 3
	Witnesses = 2
)

// Options configure a cluster.
type Options struct {
	// Dir holds the etcd data and the journal. Required.
	Dir string
	// Timeline receives the narrated timeline (nil: none).
	Timeline io.Writer
	// Log receives the hub's and the BMC clients' structured logs (nil: none).
	Log *slog.Logger
	// Metrics receives the hub's metrics (nil: none).
	Metrics prometheus.Registerer
	// Loss drops this share (0..1) of the UDP gossip packets of LossyMachine's agent, both ways.
	Loss         float64
	LossyMachine int
	Seed         uint64
	// OnRequest is called at the start of every request the simulated BMC serves (system: the system
	// ID in the path; empty for the service root and sessions).
	OnRequest func(system string, r *http.Request)
	// OnNotice is called with every notice of the hub as it is said.
	OnNotice func(at time.Time, msg string)
	// IPMI: machine IPMIMachine's BMC is Debian's ipmi_sim instead of the Redfish simulator (a BMC
	// that keeps no reset time); its power starts and stops that machine the same way.
	IPMI bool
	// BootDelay is how long after its power comes on a machine's etcd member and agent start.
	BootDelay time.Duration
	// Names, when set, are the machines' names (node names, BMC system IDs) in place of cp-0, cp-1, …:
	// a harness whose machines are named by someone else (Cluster API's Machines) names them so.
	Names []string
	// StallTolerance and ComponentGrace are the inventory's (default: none, the hub acts as soon as a
	// machine is Unhealthy: the tests of what follows a verdict; the demo and its scenarios wait:
	// AtDemoPace).
	StallTolerance, ComponentGrace pass.PerQuorum
}

// DemoPacePolicy is AtDemoPace's waits as an inventory's policy fields (flow style), for the same
// scenarios on the namespace lab.
func DemoPacePolicy() string {
	o := AtDemoPace(Options{})
	return fmt.Sprintf("stallTolerance: {quorumHeld: %v, quorumNeeded: %v}, componentGrace: {quorumHeld: %v, quorumNeeded: %v}",
		o.StallTolerance.Held, o.StallTolerance.Needed, o.ComponentGrace.Held, o.ComponentGrace.Needed)
}

// AtDemoPace is o with the demo's stall tolerance and component grace: long enough for a machine that
// pauses a second to come back by itself, short enough to watch a hung one healed (the shipped
// defaults are 30 s, 10 s when its member is needed for quorum, and 3 min, 30 s).
func AtDemoPace(o Options) Options {
	o.StallTolerance = pass.PerQuorum{Held: 4 * time.Second, Needed: 3 * time.Second}
	o.ComponentGrace = pass.PerQuorum{Held: 10 * time.Second, Needed: 5 * time.Second}
	return o
}

// IPMIMachine is the machine whose BMC is ipmi_sim when Options.IPMI is set.
const IPMIMachine = 2

// Cluster is the in-process cluster.
type Cluster struct {
	opts     Options
	password string // the simulated BMCs' (random), also in Dir/bmc-credentials
	sayMu    sync.Mutex
	etcd     *etcdcluster.Cluster
	sim      *bmcsim.Server
	key      []byte
	start    time.Time
	// ids are every member's identity (a machine's stays across its reboots, as its key file on disk
	// would); pinned are their public keys, the hub's as hub-*.
	ids      map[string]identity.Identity
	pinned   map[string][]identity.PublicKey
	net      *partition.Network
	ipmi     *ipmisim.Sim // machine IPMIMachine's BMC, with Options.IPMI
	ipmiStop func()       // stops following ipmi_sim's chassis log
	// witnesses are the witness agents; they run for the cluster's whole life.
	witnesses []*agentProc

	// passes counts the hub's passes, across its restarts (Passes).
	passCount atomic.Uint64

	mu      sync.Mutex
	names   []string // machine i's name; machines added later (AddMachine) at the end
	agents  map[int]*agentProc
	ports   map[int]int // a rebooted machine comes back on the same gossip port
	hub     *hub.Hub
	journal *boltfile.File
	hubStop func()
	// gossips are the members running now (agents, witnesses, the hub), for a change of the pinned keys.
	gossips map[*health.Gossip]bool
}

type agentProc struct {
	gossip *health.Gossip
	cancel context.CancelFunc
	done   chan struct{}
}

// pin gives member name an identity and pins its key on every member running and in the pinned-keys
// file (a machine that joins: its line added). The hub's (hub-*) is kept in a file, for `hub run`.
func (tb *Cluster) pin(name string) error {
	id := identity.NewIdentity()
	if name == "hub-*" {
		var err error
		if id, _, err = identity.LoadOrCreateIdentity(tb.HubIdentityFile()); err != nil {
			return err
		}
	}
	tb.mu.Lock()
	defer tb.mu.Unlock()
	tb.ids[name], tb.pinned[name] = id, []identity.PublicKey{id.Public()}
	p := identity.PinnedOf(tb.pinned)
	for g := range tb.gossips {
		g.SetPinned(p)
	}
	var lines []string
	for _, n := range slices.Sorted(maps.Keys(tb.pinned)) {
		lines = append(lines, n+" "+tb.pinned[n][0].String())
	}
	tmp := tb.PinnedKeysFile() + ".tmp"
	if err := os.WriteFile(tmp, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, tb.PinnedKeysFile())
}

// Identity is the identity member name signs with (an agent's node, a witness, hub-* for the hub).
func (tb *Cluster) Identity(name string) identity.Identity {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return tb.ids[name]
}

// HubIdentityFile is the hub's identity key (pinned as hub-*), for `hub run --identity-file`.
func (tb *Cluster) HubIdentityFile() string { return filepath.Join(tb.opts.Dir, "hub-identity.key") }

// PinnedKeysFile is every member's pinned key, for `hub run --pinned-file`.
func (tb *Cluster) PinnedKeysFile() string { return filepath.Join(tb.opts.Dir, "pinned-keys") }

// startGossip starts a member with its identity (the hub's, hub-*, for a hub) and the pinned keys,
// and keeps it among the running members until it stops.
func (tb *Cluster) startGossip(cfg health.GossipConfig) (*health.Gossip, error) {
	tb.mu.Lock()
	name := cfg.Node
	if cfg.Role == "hub" {
		name = "hub-*"
	}
	id, p := tb.ids[name], identity.PinnedOf(tb.pinned)
	tb.mu.Unlock()
	cfg.Identity, cfg.Pinned = &id, &p
	g, err := health.StartGossip(cfg)
	if err != nil {
		return nil, err
	}
	tb.mu.Lock()
	tb.gossips[g] = true
	tb.mu.Unlock()
	go func() {
		<-g.Done()
		tb.mu.Lock()
		delete(tb.gossips, g)
		tb.mu.Unlock()
	}()
	return g, nil
}

// Name returns machine i's name (also its node name and BMC system ID).
func Name(i int) string { return fmt.Sprintf("cp-%d", i) }

// Name is machine i's name (Options.Names, or the package's Name(i)).
func (tb *Cluster) Name(i int) string {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return tb.names[i]
}

// index is the machine named name's index (-1: none).
func (tb *Cluster) index(name string) int {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return slices.Index(tb.names, name)
}

// WitnessName returns witness i's node name.
func WitnessName(i int) string { return fmt.Sprintf("w-%d", i+1) }

// HubNode is the hub's name on the cluster's network (Partition).
const HubNode = "hub"

// Witness is witness i's node name (WitnessName).
func (tb *Cluster) Witness(i int) string { return WitnessName(i) }

// HubName is the hub's name on the cluster's network (HubNode).
func (tb *Cluster) HubName() string { return HubNode }

// Start brings up etcd, the BMC simulator and the agents (not the hub: StartHub).
func Start(opts Options) (*Cluster, error) {
	if opts.Dir == "" {
		return nil, errors.New("inproc: Options.Dir is required")
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Names != nil && len(opts.Names) != Machines {
		return nil, fmt.Errorf("inproc: Options.Names has %d names for %d machines", len(opts.Names), Machines)
	}
	tb := &Cluster{opts: opts, key: make([]byte, 32), start: time.Now(), agents: map[int]*agentProc{}, ports: map[int]int{}, net: partition.New(),
		ids: map[string]identity.Identity{}, pinned: map[string][]identity.PublicKey{}, gossips: map[*health.Gossip]bool{}}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, err
	}
	members := []string{"hub-*"}
	for i := range Machines {
		name := Name(i)
		if opts.Names != nil {
			name = opts.Names[i]
		}
		tb.names = append(tb.names, name)
		members = append(members, name)
	}
	for i := range Witnesses {
		members = append(members, WitnessName(i))
	}
	for _, name := range members {
		if err := tb.pin(name); err != nil {
			return nil, fmt.Errorf("inproc: %s's identity: %w", name, err)
		}
	}
	_, _ = rand.Read(tb.key)
	tb.password = rand.Text()
	if err := os.WriteFile(tb.CredentialsFile(), []byte("username=admin\npassword="+tb.password+"\n"), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(tb.GossipKeyFile(), []byte(base64.StdEncoding.EncodeToString(tb.key)+"\n"), 0o600); err != nil {
		return nil, err
	}
	tb.Say("demo", "every member (agents, witnesses, the hub) has an identity key of its own: each signs its reports and its claim to its name, "+
		"and every member checks them against the pinned keys")
	tb.Say("demo", "starting a %d-member etcd cluster (embedded, on 127.0.0.1)", Machines)
	var err error
	if tb.etcd, err = etcdcluster.New(filepath.Join(opts.Dir, "etcd"), Machines); err != nil {
		return nil, err
	}
	var systems []bmcsim.SystemConfig
	for i := range Machines {
		systems = append(systems, bmcsim.SystemConfig{ID: tb.Name(i), ShutdownDelay: 50 * time.Millisecond, CycleOffDuration: 100 * time.Millisecond})
	}
	simCfg := bmcsim.Config{Username: "admin", Password: tb.password, PlainHTTP: true, Systems: systems,
		OnPower: power.Redfish(func(id string) power.Machine { return machine{tb, tb.index(id)} })}
	if opts.OnRequest != nil {
		simCfg.OnRequest = func(r *http.Request) {
			_, rest, _ := strings.Cut(r.URL.Path, "/Systems/")
			system, _, _ := strings.Cut(rest, "/")
			opts.OnRequest(system, r)
		}
	}
	if tb.sim, err = bmcsim.Start(simCfg); err != nil {
		tb.etcd.Close()
		return nil, err
	}
	tb.Say("demo", "simulated Redfish BMC at %s, systems %s", tb.sim.Endpoint(), strings.Join(tb.names, ", "))
	if opts.IPMI {
		if err := tb.startIPMI(); err != nil {
			tb.Close()
			return nil, err
		}
	}
	for i := range Machines {
		if err := tb.startAgent(i); err != nil {
			tb.Close()
			return nil, err
		}
	}
	for i := range Witnesses {
		if err := tb.startWitness(i); err != nil {
			tb.Close()
			return nil, err
		}
	}
	tb.Say("demo", "witnesses %s and %s: agents on two other hosts that observe and vote, and read etcd from outside", WitnessName(0), WitnessName(1))
	return tb, nil
}

// transport makes member name's gossip transport on the cluster's network (lossy for the lossy
// machine), listening on port (0: any).
func (tb *Cluster) transport(name string, port int, drops bool) (memberlist.NodeAwareTransport, error) {
	t, err := health.NewTransport("127.0.0.1", port, nil)
	if err != nil {
		return nil, fmt.Errorf("inproc: gossip transport of %s: %w", name, err)
	}
	var inner memberlist.NodeAwareTransport = t
	if drops {
		inner = lossy.Wrap(t, tb.opts.Loss, tb.opts.Seed)
	}
	return tb.net.Wrap(name, fmt.Sprintf("127.0.0.1:%d", t.Port()), inner), nil
}

// startIPMI starts ipmi_sim as machine IPMIMachine's BMC, and follows its chassis log: power 0 stops
// the machine, power 1 starts it.
func (tb *Cluster) startIPMI() error {
	dir := filepath.Join(tb.opts.Dir, "ipmi")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	sim, err := ipmisim.StartIn(dir)
	if err != nil {
		return err
	}
	tb.ipmi = sim
	tb.Say("demo", "%s's BMC is ipmi_sim at %s (it keeps no reset time)", tb.Name(IPMIMachine), sim.Endpoint())
	tb.ipmiStop = power.FollowIPMI(machine{tb, IPMIMachine}, sim)
	return nil
}

// machine is machine i as its BMC powers it (power.Machine).
type machine struct {
	tb *Cluster
	i  int
}

// PowerOn boots the machine: its etcd member and agent start after Options.BootDelay.
func (m machine) PowerOn(by string) {
	m.tb.Say("bmc", "%s powered on (%s): its etcd member and agent start", m.tb.Name(m.i), by)
	go m.tb.powerOn(m.i)
}

// PowerOff stops the machine's etcd member and agent at once.
func (m machine) PowerOff(by string) {
	m.tb.Say("bmc", "%s powered off (%s)", m.tb.Name(m.i), by)
	m.tb.stop(m.i)
}

// startWitness starts witness i: gossip and an etcd view from outside (every member's client URL), no
// probes.
func (tb *Cluster) startWitness(i int) error {
	t, err := tb.transport(WitnessName(i), 0, false)
	if err != nil {
		return err
	}
	g, err := tb.startGossip(health.GossipConfig{Node: WitnessName(i), Cluster: "demo", Role: "witness", BindAddr: "127.0.0.1",
		Keys: [][]byte{tb.key}, Transport: t})
	if err != nil {
		return fmt.Errorf("inproc: witness %s: %w", WitnessName(i), err)
	}
	etcd, err := health.NewEtcdOutside(tb.etcd.Endpoints(), health.TLSFiles{})
	if err != nil {
		_ = g.Shutdown()
		return err
	}
	r, err := health.NewRunner(nil, nil, nil)
	if err != nil {
		_ = g.Shutdown()
		return err
	}
	tb.launch(g, health.NewAgent(g, r, etcd, 250*time.Millisecond, nil), etcd, func(p *agentProc) { tb.witnesses = append(tb.witnesses, p) })
	return nil
}

// launch joins g to any machine's agent that is alive, records the agent's process with add (under
// tb.mu) and runs the agent until it is stopped.
func (tb *Cluster) launch(g *health.Gossip, ag *health.Agent, etcd *health.Etcd, add func(*agentProc)) {
	tb.mu.Lock()
	for _, other := range tb.agents {
		if _, err := g.Join([]string{other.gossip.Addr()}); err == nil {
			break
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &agentProc{gossip: g, cancel: cancel, done: make(chan struct{})}
	add(p)
	tb.mu.Unlock()
	go func() {
		defer close(p.done)
		_ = ag.Run(ctx, time.Second)
		_ = etcd.Close()
	}()
}

// Partition cuts every gossip link between the members named in a and those in b (machine names,
// witness names, HubNode), both ways, until Heal. The etcd members are not cut: this cuts what the
// hub and the agents see of each other.
func (tb *Cluster) Partition(a, b []string) {
	tb.Say("demo", "network partition: {%s} cut off from {%s}", strings.Join(a, ", "), strings.Join(b, ", "))
	tb.net.Cut(a, b)
}

// Heal ends every partition.
func (tb *Cluster) Heal() {
	tb.Say("demo", "the partition heals")
	tb.net.Heal()
}

// CredentialsFile is the simulated BMCs' credentials file (for `hub bmc power --credentials`).
func (tb *Cluster) CredentialsFile() string { return filepath.Join(tb.opts.Dir, "bmc-credentials") }

// GossipKeyFile is the agents' gossip key file (for `hub run --gossip-key-file`).
func (tb *Cluster) GossipKeyFile() string { return filepath.Join(tb.opts.Dir, "gossip-key") }

// Seeds returns the gossip addresses of the agents running now (for `hub run --join`).
func (tb *Cluster) Seeds() []string {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	var out []string
	for _, a := range tb.agents {
		out = append(out, a.gossip.Addr())
	}
	return out
}

// Say adds a line to the timeline: time since the start, who, what.
func (tb *Cluster) Say(who, format string, args ...any) {
	tb.sayAt(time.Now(), who, fmt.Sprintf(format, args...))
}

func (tb *Cluster) sayAt(at time.Time, who, msg string) {
	if tb.opts.Timeline != nil {
		// Lines come from the hub, the simulated BMCs and the scenarios at once: one at a time.
		tb.sayMu.Lock()
		defer tb.sayMu.Unlock()
		fmt.Fprintf(tb.opts.Timeline, "%8.3fs  %-5s %s\n", at.Sub(tb.start).Seconds(), who, msg)
	}
}

func (tb *Cluster) startAgent(i int) error {
	var ag *health.Agent
	var agMu sync.Mutex
	poke := func() {
		agMu.Lock()
		defer agMu.Unlock()
		if ag != nil {
			ag.Poke()
		}
	}
	tb.mu.Lock()
	port := tb.ports[i]
	tb.mu.Unlock()
	t, err := tb.transport(tb.Name(i), port, tb.opts.Loss > 0 && i == tb.opts.LossyMachine)
	if err != nil {
		return err
	}
	cfg := health.GossipConfig{Node: tb.Name(i), Cluster: "demo", Role: "agent", BindAddr: "127.0.0.1", BindPort: port,
		Keys: [][]byte{tb.key}, OnPeerChange: poke, Transport: t}
	g, err := tb.startGossip(cfg)
	if err != nil {
		return fmt.Errorf("inproc: agent %s: %w", tb.Name(i), err)
	}
	_, portText, _ := strings.Cut(g.Addr(), "127.0.0.1:")
	_, _ = fmt.Sscan(portText, &port)
	etcd, err := health.NewEtcd(health.EtcdConfig{Endpoint: tb.etcd.Endpoints()[i]})
	if err != nil {
		_ = g.Shutdown()
		return err
	}
	// 400 ms: three embedded members under -race on a loaded 2-core machine missed 150 ms often enough
	// that two misses in a row made healthy voters Suspect, and a quorum-checked step was refused.
	r, err := health.NewRunner([]health.ProbeSpec{{Probe: etcd.Probe(), Interval: 500 * time.Millisecond, Timeout: 400 * time.Millisecond}}, nil, poke)
	if err != nil {
		_ = g.Shutdown()
		return err
	}
	agMu.Lock()
	ag = health.NewAgent(g, r, etcd, 250*time.Millisecond, nil).WatchKubeadm(tb.KubeadmTmpDir(i))
	agMu.Unlock()
	tb.launch(g, ag, etcd, func(p *agentProc) { tb.agents[i], tb.ports[i] = p, port })
	return nil
}

// AddMachine adds a machine named name as a replacement joins: a new etcd member (member add, then
// started with the cluster's peers, as kubeadm joins one) and its agent; it has no BMC. It returns the
// machine's index and its member's name.
func (tb *Cluster) AddMachine(ctx context.Context, name string) (int, string, error) {
	member := "etcd-" + name
	i, err := tb.etcd.Add(ctx, member)
	if err != nil {
		return 0, "", err
	}
	tb.mu.Lock()
	tb.names = append(tb.names, name)
	tb.mu.Unlock()
	if err := tb.pin(name); err != nil {
		return 0, "", err
	}
	if n := tb.index(name); n != i {
		return 0, "", fmt.Errorf("inproc: machine %s is %d, its etcd member %d", name, n, i)
	}
	tb.Say("demo", "%s joins: etcd member %s added and started, its agent starts", name, member)
	return i, member, tb.startAgent(i)
}

// RemoveMember removes machine i's etcd member from the cluster (member remove) and stops the
// machine's processes, as Cluster API's KubeadmControlPlane does before deleting its Machine.
func (tb *Cluster) RemoveMember(ctx context.Context, i int) error {
	tb.Say("demo", "%s's etcd member %s removed from the cluster", tb.Name(i), tb.etcd.Name(i))
	tb.stop(i)
	return tb.etcd.Remove(ctx, i)
}

// KubeadmTmpDir is machine i's kubeadm temporary directory (its /etc/kubernetes/tmp), which its agent
// watches for an upgrade under way.
func (tb *Cluster) KubeadmTmpDir(i int) string {
	return filepath.Join(tb.opts.Dir, "kubeadm-tmp-"+tb.Name(i))
}

// Hang makes machine i stop answering: its agent and its etcd member die, its power stays on.
func (tb *Cluster) Hang(i int) {
	tb.Say("demo", "%s hangs: its agent and etcd member stop answering, its power stays on", tb.Name(i))
	tb.stop(i)
}

// Resume brings hung machine i back by itself, with no BMC call: its etcd member and its agent start
// again on its disk (in-process they cannot be frozen and thawed; to the hub it is the same: a machine
// that stopped answering and answers again).
func (tb *Cluster) Resume(i int) {
	tb.Say("demo", "%s answers again by itself", tb.Name(i))
	tb.mu.Lock()
	_, running := tb.agents[i]
	tb.mu.Unlock()
	if !running {
		tb.boot(i, 0)
	}
}

// Panic hangs machine i as a kernel panic does, and has its BMC log the OS critical stop in its event
// log, as Linux's IPMI driver has the BMC log it.
func (tb *Cluster) Panic(i int) {
	tb.Say("demo", "%s panics: its BMC logs an OS critical stop; its agent and etcd member stop answering, its power stays on", tb.Name(i))
	// Logged as the kernel panics, before anything notices it has stopped.
	if i == IPMIMachine && tb.ipmi != nil {
		if err := tb.ipmi.AddSEL(context.Background(), ipmisim.SELOSCriticalStop); err != nil {
			tb.Say("demo", "ipmi_sim did not log the panic: %v", err)
		}
	} else {
		tb.sim.LogEvent(tb.Name(i), bmcsim.Event{SensorType: "OS Stop/Shutdown", Message: "Run-time critical stop"})
	}
	tb.stop(i)
}

// stop ends machine i's processes the way a power cut does: no goodbye in the gossip pool.
func (tb *Cluster) stop(i int) {
	tb.mu.Lock()
	p := tb.agents[i]
	delete(tb.agents, i)
	tb.mu.Unlock()
	if p != nil {
		_ = p.gossip.Shutdown()
		p.cancel()
		<-p.done
	}
	tb.etcd.Stop(i)
}

// powerOn boots machine i after Options.BootDelay: its etcd member and its agent start, unless its
// agent runs (a BMC that powers on a machine already on).
func (tb *Cluster) powerOn(i int) { tb.boot(i, tb.opts.BootDelay) }

// boot starts machine i's etcd member and agent after delay, unless its agent runs.
func (tb *Cluster) boot(i int, delay time.Duration) {
	time.Sleep(delay)
	tb.mu.Lock()
	_, running := tb.agents[i]
	tb.mu.Unlock()
	if running {
		return
	}
	if err := tb.etcd.Restart(i); err != nil {
		// etcd's own words come last ("member count is unequal": a member of an old cluster that
		// finds its peers in another).
		msg := err.Error()
		if k := strings.LastIndex(msg, ": "); k >= 0 {
			msg = msg[k+2:]
		}
		tb.Say("demo", "%s's etcd member does not start: %s", tb.Name(i), msg)
	}
	if err := tb.startAgent(i); err != nil {
		tb.Say("demo", "restarting the agent of %s: %v", tb.Name(i), err)
	}
}

// Inventory is the hub's inventory for the cluster: every machine a control-plane etcd member,
// healed by reboot; short timeouts so that the demo moves at a human pace.
func (tb *Cluster) Inventory() (pass.Inventory, error) {
	inv := pass.Inventory{Cluster: "demo", Policy: pass.Policy{Quorum: quorum.DefaultPolicy(), Assess: assess.DefaultPolicy(),
		RateMax: 20, RatePer: time.Minute, Cooldown: time.Second, MaxAttempts: 3, FlapWindow: 2 * time.Second,
		StallTolerance: tb.opts.StallTolerance, ComponentGrace: tb.opts.ComponentGrace}}
	for i := range Witnesses {
		inv.Witnesses = append(inv.Witnesses, WitnessName(i))
	}
	inv.Policy.Assess.EtcdUnreachableTimeout = time.Second
	for i := range Machines {
		ep, err := bmc.ParseEndpoint(fmt.Sprintf("%s/systems/%s", tb.sim.Endpoint(), tb.Name(i)))
		if err != nil {
			return inv, err
		}
		creds := bmc.NewCredentials("admin", tb.password)
		if i == IPMIMachine && tb.ipmi != nil {
			if ep, err = bmc.ParseEndpoint(tb.ipmi.Endpoint()); err != nil {
				return inv, err
			}
			creds = bmc.NewCredentials(tb.ipmi.Username, tb.ipmi.Password)
		}
		inv.Machines = append(inv.Machines, pass.Machine{MachineRef: assess.MachineRef{Name: tb.Name(i), Node: tb.Name(i),
			Member: tb.etcd.Name(i)}, Class: "control-plane", Strategy: quorum.Reboot, Pool: "control-plane", Endpoint: ep,
			Credentials: creds})
	}
	return inv, nil
}

// HubOptions adjust the hub StartHub starts.
type HubOptions struct {
	// Journal path (default Dir/journal.db).
	Journal string
	// WrapPower wraps each machine's BMC controller (crash tests cut the hub off around a BMC call).
	WrapPower func(m pass.Machine, p execute.Power) execute.Power
	// Inventory, when set, adjusts the inventory (policy, strategies).
	Inventory func(*pass.Inventory)
	// Store, when set, is the hub's journal instead of a bbolt file (Kubernetes mode's Remediation
	// objects); CrashHub cannot cut it off.
	Store journal.Store
	// Configure, when set, adjusts the hub's configuration last (Kubernetes mode's actuators).
	Configure func(*hub.Config)
}

// StartHub starts a hub on the cluster; StopHub (or Close) stops it.
func (tb *Cluster) StartHub(o HubOptions) error {
	if o.Journal == "" {
		o.Journal = filepath.Join(tb.opts.Dir, "journal.db")
	}
	// A new gossip name at every start, as `hub run` does: see there.
	t, err := tb.transport(HubNode, 0, false)
	if err != nil {
		return err
	}
	g, err := tb.startGossip(health.GossipConfig{Node: "hub-" + rand.Text()[:6], Cluster: "demo", Role: "hub", BindAddr: "127.0.0.1",
		Keys: [][]byte{tb.key}, Transport: t})
	if err != nil {
		return err
	}
	if _, err := g.Join(tb.Seeds()); err != nil {
		_ = g.Shutdown()
		return fmt.Errorf("inproc: the hub cannot join the agents: %w", err)
	}
	var store journal.Store = o.Store
	var j *boltfile.File
	where := "Remediation objects"
	if store == nil {
		if j, err = boltfile.Open(o.Journal, 0); err != nil {
			_ = g.Shutdown()
			return err
		}
		store, where = j, o.Journal
	}
	closeJournal := func() {
		if j != nil {
			_ = j.Close()
		}
	}
	inv, err := tb.Inventory()
	if err != nil {
		closeJournal()
		_ = g.Shutdown()
		return err
	}
	inv.Policy.ComeBackTimeout = 30 * time.Second
	if o.Inventory != nil {
		o.Inventory(&inv)
	}
	log := tb.opts.Log
	cfg := hub.Config{Inventory: inv, Gossip: g, Journal: store, Log: log, Tick: 100 * time.Millisecond,
		Metrics: tb.opts.Metrics,
		OnNotice: func(at time.Time, msg string) {
			tb.sayAt(at, "hub", msg)
			if tb.opts.OnNotice != nil {
				tb.opts.OnNotice(at, msg)
			}
		},
		PowerFor: func(m pass.Machine) (execute.Power, error) {
			c, err := bmc.New(m.Endpoint, m.Credentials, bmc.Options{PollInterval: 20 * time.Millisecond, VerifyTimeout: 10 * time.Second,
				GracefulTimeout: 2 * time.Second, Logger: log})
			if err != nil || o.WrapPower == nil {
				return c, err
			}
			return o.WrapPower(m, c), nil
		}}
	if o.Configure != nil {
		o.Configure(&cfg)
	}
	after := cfg.AfterPass
	cfg.AfterPass = func(n uint64) {
		tb.passCount.Add(1)
		if after != nil {
			after(n)
		}
	}
	h, err := hub.New(cfg)
	if err != nil {
		closeJournal()
		_ = g.Shutdown()
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := h.Run(ctx); err != nil {
			tb.Say("hub", "stopped: %v", err)
		}
	}()
	tb.mu.Lock()
	tb.hub, tb.journal = h, j
	tb.hubStop = func() {
		cancel()
		<-done
		_ = g.Shutdown()
		closeJournal()
	}
	tb.mu.Unlock()
	tb.Say("demo", "hub started (journal %s, epoch %d)", where, store.Epoch())
	return nil
}

// StopHub stops the hub as a crash would leave it: remediations in flight stay InProgress in the
// journal for the next hub to resume.
func (tb *Cluster) StopHub() {
	tb.mu.Lock()
	stop := tb.hubStop
	tb.hubStop, tb.hub, tb.journal = nil, nil, nil
	tb.mu.Unlock()
	if stop != nil {
		stop()
		tb.Say("demo", "hub stopped")
	}
}

// CrashHub kills the hub as a crash would, at this very instant: its journal takes no more writes
// (whatever it was about to record is lost), then it stops.
func (tb *Cluster) CrashHub() {
	tb.mu.Lock()
	j := tb.journal
	tb.mu.Unlock()
	if j != nil { // a bbolt journal; nil when the hub runs on another Store
		_ = j.Close()
		tb.Say("demo", "the hub crashes")
	}
	tb.StopHub()
}

// Hub returns the running hub (nil when none runs).
func (tb *Cluster) Hub() *hub.Hub {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return tb.hub
}

// Log is the cluster's logger.
func (tb *Cluster) Log() *slog.Logger { return tb.opts.Log }

// Sim returns the BMC simulator.
func (tb *Cluster) Sim() *bmcsim.Server { return tb.sim }

// EtcdEndpoint is machine i's etcd member's client URL.
func (tb *Cluster) EtcdEndpoint(i int) string { return tb.etcd.Endpoints()[i] }

// EtcdRunning reports whether machine i's etcd member runs.
func (tb *Cluster) EtcdRunning(i int) bool { return tb.etcd.Running(i) }

// Close stops everything.
func (tb *Cluster) Close() {
	tb.StopHub()
	tb.mu.Lock()
	agents := slices.Collect(maps.Values(tb.agents))
	agents = append(agents, tb.witnesses...)
	tb.agents, tb.witnesses = map[int]*agentProc{}, nil
	tb.mu.Unlock()
	for _, p := range agents {
		_ = p.gossip.Shutdown()
		p.cancel()
		<-p.done
	}
	_ = tb.sim.Close()
	if tb.ipmi != nil {
		tb.ipmiStop()
		tb.ipmi.Stop()
	}
	tb.etcd.Close()
}

// Passes waits until the hub has run n more passes: "nothing happened" is asserted over passes, which
// a loaded machine cannot skip the way it can stretch a sleep (n passes also take at least n-1 ticks).
func (tb *Cluster) Passes(ctx context.Context, n uint64) error {
	want := tb.passCount.Load() + n
	return tb.WaitFor(ctx, time.Minute, fmt.Sprintf("%d passes of the hub", n), func() bool { return tb.passCount.Load() >= want })
}

// WaitFor polls cond every 50 ms; on timeout it returns an error with the hub's events and journal.
func (tb *Cluster) WaitFor(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s\n%s", timeout, what, tb.Dump())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// Dump is what the hub says of each machine now, its events and its journal, for a test's failure.
func (tb *Cluster) Dump() string {
	h := tb.Hub()
	if h == nil {
		return "(no hub running)"
	}
	var b strings.Builder
	st := h.Status(context.Background())
	fmt.Fprintf(&b, "observers: %d expected, heard %v (majority %v)\nmachines now:\n", st.Observers.Expected, st.Observers.Heard, st.Observers.Majority)
	for _, m := range st.Machines {
		fmt.Fprintf(&b, "  %s %s etcd %q in flight %v: %s %s\n", m.Name, m.Verdict, m.EtcdHealth, m.Remediation != nil, strings.Join(m.Reasons, "; "), m.Decision)
	}
	b.WriteString("hub events:\n")
	for _, e := range h.Timeline() {
		b.WriteString("  " + e + "\n")
	}
	b.WriteString("journal:\n")
	for i := range Machines {
		hist, _ := h.History(context.Background(), tb.Name(i))
		for _, r := range hist {
			fmt.Fprintf(&b, "  %s %s\n", r.ID, r.State)
			for _, ev := range r.History {
				fmt.Fprintf(&b, "    %s step %d %s: %s\n", ev.At.Format("15:04:05.000"), ev.Step, ev.Kind, ev.Detail)
			}
		}
	}
	return b.String()
}

// AllHealthy: every machine Healthy with a healthy etcd member, and no remediation in flight.
func (tb *Cluster) AllHealthy() bool {
	h := tb.Hub()
	if h == nil {
		return false
	}
	for _, m := range h.Status(context.Background()).Machines {
		if m.Verdict != assess.VerdictHealthy || (m.Member != "" && m.EtcdHealth != quorum.Healthy.String()) || m.Remediation != nil {
			return false
		}
	}
	return true
}

// Remediations returns how many remediations of machine i the journal holds, and the state of the latest.
func (tb *Cluster) Remediations(i int) (int, journal.State) {
	h := tb.Hub()
	if h == nil {
		return 0, ""
	}
	hist, err := h.History(context.Background(), tb.Name(i))
	if err != nil || len(hist) == 0 {
		return 0, ""
	}
	return len(hist), hist[len(hist)-1].State
}

// Resets returns the reset requests machine i's BMC has served (for ipmi_sim: the power changes it
// made, "power 0", "power 1").
func (tb *Cluster) Resets(i int) []string {
	if i == IPMIMachine && tb.ipmi != nil {
		return tb.ipmi.Actions()
	}
	return tb.sim.Resets(tb.Name(i))
}

// IPMI returns machine IPMIMachine's ipmi_sim (nil without Options.IPMI).
func (tb *Cluster) IPMI() *ipmisim.Sim { return tb.ipmi }

// LoseForGood kills machine i for good: its power supply fails (its BMC reads it Off and cannot power
// it on) and its disk dies with its etcd member's data. Its BMC must be the Redfish simulator.
func (tb *Cluster) LoseForGood(i int) error {
	if i == IPMIMachine && tb.ipmi != nil {
		return fmt.Errorf("inproc: %s's BMC is ipmi_sim, whose power cannot be made to fail", tb.Name(i))
	}
	tb.Say("demo", "%s dies for good: its power supply fails (its BMC reads it Off and cannot power it on), and its disk with its etcd data", tb.Name(i))
	tb.sim.SetDead(tb.Name(i), true)
	tb.sim.SetPowerState(tb.Name(i), bmcsim.Off)
	return tb.etcd.Wipe(i)
}

// Replace puts a new machine in the place of machine i, lost for good: the same name, BMC and
// addresses, with a working power supply and an empty disk. It stays off until powered on.
func (tb *Cluster) Replace(i int) {
	tb.Say("demo", "%s is replaced: a new machine in its place (same name, BMC and addresses), an empty disk, still off", tb.Name(i))
	tb.sim.SetDead(tb.Name(i), false)
}

// RecoverOn is `agent recover` on machine i, the survivor, with the hub's plan as `hub recover --yes
// -o json` writes it: etcd rebuilt there as a one-member cluster. Its steps go to the timeline.
func (tb *Cluster) RecoverOn(ctx context.Context, i int, plan pass.RecoveryPlan) (*recovery.Record, error) {
	p, err := nodePlan(plan)
	if err != nil {
		return nil, err
	}
	return recovery.Recover(ctx, tb.node(i), p)
}

// RejoinOn is `agent rejoin` on machine i with the hub's plan: its member added back to the cluster
// rebuilt on machine survivor, as a learner promoted once caught up.
func (tb *Cluster) RejoinOn(ctx context.Context, i, survivor int, plan pass.RecoveryPlan) (*recovery.Joined, error) {
	p, err := nodePlan(plan)
	if err != nil {
		return nil, err
	}
	self := recovery.Member{Name: tb.etcd.Name(i), DataDir: tb.etcd.DataDir(i), PeerURL: tb.etcd.PeerURL(i)}
	return recovery.Rejoin(ctx, tb.node(i), p, self, []string{tb.etcd.Endpoints()[survivor]})
}

// nodePlan is the hub's plan as the node reads it: through its JSON, as the operator hands it over.
func nodePlan(plan pass.RecoveryPlan) (recovery.Plan, error) {
	var p recovery.Plan
	b, err := json.Marshal(plan)
	if err == nil {
		err = json.Unmarshal(b, &p)
	}
	if err != nil {
		return p, fmt.Errorf("inproc: the recovery plan as JSON: %w", err)
	}
	return p, nil
}

// node is machine i as `agent recover` and `agent rejoin` find it.
func (tb *Cluster) node(i int) recovery.Node {
	return recovery.Node{Endpoint: tb.etcd.Endpoints()[i], Layout: tb.etcd.Layout(i), DataDir: tb.etcd.DataDir(i),
		StateDir: filepath.Join(tb.opts.Dir, "recovery", tb.Name(i)), Log: tb.opts.Log, Out: sayWriter{tb, tb.Name(i)}}
}

// sayWriter puts each line written to it on the timeline, said by who (without the time the node's
// commands print first).
type sayWriter struct {
	tb  *Cluster
	who string
}

func (w sayWriter) Write(p []byte) (int, error) {
	for line := range strings.Lines(string(p)) {
		line = strings.TrimRight(line, "\n")
		if len(line) > 10 && line[2] == ':' && line[5] == ':' {
			line = strings.TrimLeft(line[8:], " ")
		}
		w.tb.Say(w.who, "%s", line)
	}
	return len(p), nil
}

// Put writes key through the cluster and returns the revision it was written at.
func (tb *Cluster) Put(ctx context.Context, key, value string) (int64, error) {
	cli, err := tb.etcdClient(tb.etcd.Endpoints()...)
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	r, err := cli.Put(ctx, key, value)
	if err != nil {
		return 0, fmt.Errorf("inproc: writing %s: %w", key, err)
	}
	return r.Header.Revision, nil
}

// Get reads key through machine i's member (a linearizable read): its value and the revision the
// cluster is at.
func (tb *Cluster) Get(ctx context.Context, i int, key string) (string, int64, error) {
	cli, err := tb.etcdClient(tb.etcd.Endpoints()[i])
	if err != nil {
		return "", 0, err
	}
	defer cli.Close()
	r, err := cli.Get(ctx, key)
	if err != nil {
		return "", 0, fmt.Errorf("inproc: reading %s from %s: %w", key, tb.Name(i), err)
	}
	if len(r.Kvs) == 0 {
		return "", r.Header.Revision, nil
	}
	return string(r.Kvs[0].Value), r.Header.Revision, nil
}

func (tb *Cluster) etcdClient(endpoints ...string) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("inproc: an etcd client of %v: %w", endpoints, err)
	}
	return cli, nil
}

// Settle waits until every machine is healthy with nothing in flight, and past the cooldown of the
// last remediation, so that a scenario starts from a calm cluster.
func (tb *Cluster) Settle(ctx context.Context) error {
	if err := tb.WaitFor(ctx, 60*time.Second, "every machine Healthy", tb.AllHealthy); err != nil {
		return err
	}
	inv, err := tb.Inventory()
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(inv.Policy.Cooldown + 100*time.Millisecond):
	}
	return nil
}
