// Package inventory reads the standalone hub's inventory file (its machines, their BMCs, the
// witnesses and the policy) into the pass's values, and holds the checks a policy's fields get
// wherever an operator writes them (the inventory's policy: section, a HealthPolicy's spec). Every
// error names the file, or the field, and what to write instead.
package inventory

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hale-dev/hale/bmc"
	"github.com/hale-dev/hale/config"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/hub/pass"
	"github.com/hale-dev/hale/quorum"
)

// File is the standalone hub's inventory and policy, as written in YAML.
type File struct {
	// Cluster names the gossip pool the hub joins (the agents' cluster).
	Cluster string `json:"cluster"`
	// Policy is how much the hub may do, and when (every setting has a default).
	Policy PolicyFile `json:"policy"`
	// Classes name how machines are healed; a machine names its class.
	Classes map[string]Class `json:"classes"`
	// Machines are the machines the hub heals (in Kubernetes mode with --discover, the cluster's are
	// added to these).
	Machines []MachineFile `json:"machines"`
	// Witnesses are the gossip node names of agents in the witness role: on hosts that are not
	// control-plane machines, they observe and vote (liveness, and etcd from outside when given etcd
	// access) so that a majority of observers can exist when control-plane machines are gone.
	Witnesses []string `json:"witnesses"`
}

// PolicyFile is the policy section.
type PolicyFile struct {
	// MinFaultTolerance is how many healthy voters to keep beyond quorum when a step costs one
	// (default 0: a step may take the cluster to exactly quorum, never below).
	MinFaultTolerance int `json:"minFaultTolerance"`
	// MaxLearners is etcd's --max-learners (default 1; 0 forbids the replacement paths that add a
	// learner).
	MaxLearners *int `json:"maxLearners"`
	// MaxInFlight: machines that are not etcd members remediated at once, per pool: a count or a
	// percentage ("10%": rounds down, but allows 1; default 10%).
	MaxInFlight string `json:"maxInFlight"`
	// MaxUnhealthy: when more of a pool than this are unhealthy (a count or a percentage), the whole
	// pool is held, as a MachineHealthCheck's maxUnhealthy (default 40%).
	MaxUnhealthy string `json:"maxUnhealthy"`
	// ProbeTimeouts: how long each probe must fail before its machine is Unhealthy, by probe name
	// (defaults: docs/reference/agent.md, "Probes"); a probe not judged by default is judged once
	// listed here.
	ProbeTimeouts map[string]config.Duration `json:"probeTimeouts"`
	// NodeConditionTimeouts (Kubernetes mode): how long a Node condition must be bad to count as
	// evidence (never alone); e.g. Ready: 30s.
	NodeConditionTimeouts map[string]config.Duration `json:"nodeConditionTimeouts"`
	// RateLimit stops a remediation storm: at most max remediations started in any window of per.
	// Neither the rate limit, the cooldown nor maxAttempts counts a remediation that ended having done
	// nothing (refused by the check before its first step, or its request withdrawn because the
	// machine was healthy again); its machine is tried again 30 s after it.
	RateLimit struct {
		// Max remediations started within any window of per (default 3).
		Max int `json:"max"`
		// Per is the rate limit's window (default 10 min).
		Per config.Duration `json:"per"`
	} `json:"rateLimit"`
	// Cooldown: a machine that recovered is not remediated again before this (min healthy period;
	// default 5 min).
	Cooldown config.Duration `json:"cooldown"`
	// MaxAttempts: failed remediations of a machine (since it was last healthy), or remediations of it
	// within flapWindow however they ended, before the hub gives up on it and says so; attempts after
	// the first are hard power cycles (default 3).
	MaxAttempts int `json:"maxAttempts"`
	// FlapWindow: a machine remediated maxAttempts times within it is flapping (it comes back, then
	// fails again): the hub gives up on it (default 1 h).
	FlapWindow config.Duration `json:"flapWindow"`
	// ComeBackTimeout: how long a remediated machine may take to come back (its agent reporting
	// again, its member healthy) before the remediation fails (default 10 min: a bare-metal server's
	// POST and boot). A power cycle after which nobody sees the machine is not repeated by itself.
	ComeBackTimeout config.Duration `json:"comeBackTimeout"`
	// DeadTimeout: how long a machine must have been declared dead, by the hub and a majority of live
	// observers, before it is Unhealthy (default 0: at once; the gossip's suspicion already had its
	// say). The verdict is not the action: stallTolerance says when a dead machine is acted on.
	DeadTimeout config.Duration `json:"deadTimeout"`
	// EtcdUnreachableTimeout: how long a majority of observers must fail to reach a machine's etcd
	// member before it is Unhealthy (default 5 s).
	EtcdUnreachableTimeout config.Duration `json:"etcdUnreachableTimeout"`
	// StaleAfter: a report older than this is no evidence of anything, the agent may be stuck
	// (default 20 s: four missed reports).
	StaleAfter config.Duration `json:"staleAfter"`
	// EtcdCatchUp: how much longer than probeTimeouts.etcd the etcd probe may fail while the member
	// follows the leader the other members follow (default 30 s).
	EtcdCatchUp config.Duration `json:"etcdCatchUp"`
	// PlannedWork (Kubernetes mode): the planned work during which the hub starts nothing on a machine
	// (its hold PlannedWork; an operator's `hub reboot` still may, and the machine's evidence still counts
	// toward etcd's quorum): cordoned (its Node unschedulable: kubectl cordon, kubectl drain), deleting (its
	// Cluster API Machine being deleted), rollout (its KubeadmControlPlane or MachineDeployment rolling
	// out: RollingOut True), nodeMaintenance (a medik8s NodeMaintenance for its Node), kubeadmUpgrade (a
	// `kubeadm upgrade` replacing its static pod manifests, as its agent reports; this one in standalone
	// mode too). Default: all five; [] for none.
	PlannedWork *[]string `json:"plannedWork"`
	// StallTolerance: how long a machine dead to a majority of the observers must have shown no sign of
	// life (a report, a gossip ack, an answer of its etcd member, to any observer) before the hub
	// power-cycles, fences or replaces it, unless its BMC proves a hang first (its power Off unasked, a
	// kernel panic, machine check or watchdog expiry in its event log, its health turned Critical).
	// Machines pause and resume by themselves (VM stuns, live migrations, storage and CPU stalls): the
	// verdict stays fast, the action waits. quorumHeld while etcd keeps quorum without it (default 30s),
	// quorumNeeded when its member is needed for quorum (default 10s). 0s: at once (not advised).
	StallTolerance PerQuorumFile `json:"stallTolerance"`
	// ComponentGrace: how long a machine whose agent reports, its etcd, API server or kubelet probe
	// failing, is left to the kubelet's (or systemd's) restart of that component before the hub acts on
	// it: quorumHeld default 3m (kubeadm's liveness probes restart a hung etcd or API server in about
	// 2.5 min), quorumNeeded default 30s.
	ComponentGrace PerQuorumFile `json:"componentGrace"`
	// OutOfServiceAfter (Kubernetes mode): a machine Hale fenced (powered off, read back Off) whose BMC
	// has read it Off for this long has its Node tainted node.kubernetes.io/out-of-service=nodeshutdown:NoExecute
	// (Kubernetes' non-graceful node shutdown: its pods are deleted and their volumes detached, so
	// that they start elsewhere). The taint goes as soon as the BMC reads On or cannot be read, the
	// machine is heard again or detached. Default 1m; "0s": never.
	OutOfServiceAfter *config.Duration `json:"outOfServiceAfter"`
}

// PerQuorumFile is a wait that depends on whether etcd keeps quorum without the machine.
type PerQuorumFile struct {
	// QuorumHeld: while etcd keeps quorum without the machine (or it is no etcd member).
	QuorumHeld *config.Duration `json:"quorumHeld"`
	// QuorumNeeded: when its member is needed for etcd's quorum.
	QuorumNeeded *config.Duration `json:"quorumNeeded"`
}

// apply sets dst's waits that f sets (field names the policy field, for errors).
func (f PerQuorumFile) apply(field string, dst *pass.PerQuorum) error {
	for _, w := range []struct {
		name string
		v    *config.Duration
		dst  *time.Duration
	}{{"quorumHeld", f.QuorumHeld, &dst.Held}, {"quorumNeeded", f.QuorumNeeded, &dst.Needed}} {
		if w.v == nil {
			continue
		}
		if err := CheckWait(fmt.Sprintf("policy.%s.%s", field, w.name), w.v.Duration, "at once"); err != nil {
			return err
		}
		*w.dst = w.v.Duration
	}
	return nil
}

// The kinds of planned work (policy.plannedWork).
const (
	WorkCordoned        = "cordoned"
	WorkDeleting        = "deleting"
	WorkRollout         = "rollout"
	WorkNodeMaintenance = "nodeMaintenance"
	WorkKubeadmUpgrade  = pass.WorkKubeadmUpgrade
)

// PlannedWorkKinds are the kinds of planned work, in the order they are checked.
func PlannedWorkKinds() []string {
	return []string{WorkCordoned, WorkDeleting, WorkRollout, WorkNodeMaintenance, WorkKubeadmUpgrade}
}

// Class is a machine class: how its machines are healed.
type Class struct {
	// Strategy is "reboot" (power-cycle, escalating to a hard cycle) or "fence" (power off at once
	// and keep it off until an operator's hub reboot).
	Strategy string `json:"strategy"`
	// Pool groups machines that are not etcd members for maxInFlight/maxUnhealthy (default: the class name).
	Pool string `json:"pool"`
}

// MachineFile is one machine of the inventory.
type MachineFile struct {
	// Name is the machine's name in every command and message. Required, unique.
	Name string `json:"name"`
	// Node is its agent's node name (default: name).
	Node string `json:"node"`
	// Member is its etcd member name; empty when it is not an etcd member.
	Member string `json:"member"`
	// Class is one of classes (required).
	Class string `json:"class"`
	// BMC is how the hub reaches the machine's BMC (none: the machine is watched, not healed,
	// unless Kubernetes mode gives it an owner).
	BMC BMCFile `json:"bmc"`
}

// BMCFile says how to reach a machine's BMC.
type BMCFile struct {
	// Endpoint is redfish://HOST[:PORT][/systems/ID] (https, also written redfish+https://;
	// redfish+http:// for plain HTTP; metal3's idrac-redfish, redfish-virtualmedia, idrac-virtualmedia and
	// ilo5-redfish schemes too, each also +http or +https) or ipmi://HOST[:PORT] (IPMI over LAN,
	// lanplus). A Redfish endpoint without a system ID needs a service with exactly one system.
	Endpoint string `json:"endpoint"`
	// Credentials is a file of username= and password= lines, or a directory holding files named
	// username and password (a mounted Secret); relative to the inventory's directory.
	Credentials string `json:"credentials"`
	// CAFile is the CA bundle a Redfish BMC's certificate is checked against (default: the system's
	// roots); relative to the inventory's directory.
	CAFile string `json:"caFile"`
	// Insecure skips checking a Redfish BMC's certificate (a lab; prefer caFile).
	Insecure bool `json:"insecure"`
}

// Load reads and validates an inventory file. Every error names the file and the field.
func Load(path string) (pass.Inventory, error) { return load(path, true) }

// load: machinesRequired is false when the cluster is where machines are found
// (Kubernetes mode's discovery); the file then gives the cluster name, the policy and the machines
// whose BMC Hale calls itself.
func load(path string, machinesRequired bool) (pass.Inventory, error) {
	var f File
	if err := config.Load("inventory", path, &f); err != nil {
		return pass.Inventory{}, err
	}
	for i := range f.Machines { // relative paths are the inventory's directory's
		config.RelativeTo(path, &f.Machines[i].BMC.Credentials, &f.Machines[i].BMC.CAFile)
	}
	inv, err := f.validate(machinesRequired)
	if err != nil {
		return pass.Inventory{}, fmt.Errorf("inventory %s: %w", path, err)
	}
	return inv, nil
}

func (f File) validate(machinesRequired bool) (pass.Inventory, error) {
	inv := pass.Inventory{Cluster: f.Cluster}
	if f.Cluster == "" {
		return inv, errors.New("cluster: required (the agents' gossip cluster name)")
	}
	p, err := f.Policy.Validate()
	if err != nil {
		return inv, err
	}
	inv.Policy = p
	for _, name := range slices.Sorted(maps.Keys(f.Classes)) { // the same file, the same error
		st, err := quorum.ParseStrategy(f.Classes[name].Strategy)
		if err != nil {
			return inv, fmt.Errorf("classes.%s.strategy: %w", name, err)
		}
		if st == quorum.Replace {
			return inv, fmt.Errorf("classes.%s.strategy: replace is how a Cluster API owner heals its machines, found by hub run --kubernetes --discover, not a class of BMC machines: want reboot or fence", name)
		}
	}
	if len(f.Machines) == 0 && machinesRequired {
		return inv, errors.New("machines: none listed")
	}
	names, nodes, members := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for i, mf := range f.Machines {
		at := fmt.Sprintf("machines[%d]", i)
		m := pass.Machine{MachineRef: assess.MachineRef{Name: mf.Name, Node: mf.Node, Member: mf.Member}, Class: mf.Class,
			CAFile: mf.BMC.CAFile, Insecure: mf.BMC.Insecure}
		switch {
		case mf.Name == "" || strings.Contains(mf.Name, "/"):
			return inv, fmt.Errorf("%s.name: %q must be non-empty and without /", at, mf.Name)
		case names[mf.Name]:
			return inv, fmt.Errorf("%s.name: %q is listed twice", at, mf.Name)
		}
		if m.Node == "" {
			m.Node = m.Name
		}
		if nodes[m.Node] {
			return inv, fmt.Errorf("%s (%s).node: %q belongs to another machine too", at, mf.Name, m.Node)
		}
		if m.Member != "" && members[m.Member] {
			return inv, fmt.Errorf("%s (%s).member: etcd member %q belongs to another machine too", at, mf.Name, m.Member)
		}
		names[mf.Name], nodes[m.Node], members[m.Member] = true, true, m.Member != ""
		class, ok := f.Classes[mf.Class]
		if !ok {
			return inv, fmt.Errorf("%s (%s).class: %q is not defined under classes", at, mf.Name, mf.Class)
		}
		m.Strategy, _ = quorum.ParseStrategy(class.Strategy)
		m.Pool = class.Pool
		if m.Pool == "" {
			m.Pool = mf.Class
		}
		if mf.BMC.Endpoint == "" {
			return inv, fmt.Errorf("%s (%s).bmc.endpoint: required", at, mf.Name)
		}
		if m.Endpoint, err = bmc.ParseEndpoint(mf.BMC.Endpoint); err != nil {
			return inv, fmt.Errorf("%s (%s).bmc.endpoint: %w", at, mf.Name, err)
		}
		if mf.BMC.Credentials == "" {
			return inv, fmt.Errorf("%s (%s).bmc.credentials: required (a file or a Secret-style directory)", at, mf.Name)
		}
		if m.Credentials, err = bmc.LoadCredentials(mf.BMC.Credentials); err != nil {
			return inv, fmt.Errorf("%s (%s).bmc.credentials: %w", at, mf.Name, err)
		}
		if mf.BMC.CAFile != "" {
			if _, err := os.Stat(mf.BMC.CAFile); err != nil {
				return inv, fmt.Errorf("%s (%s).bmc.caFile: %w", at, mf.Name, err)
			}
		}
		inv.Machines = append(inv.Machines, m)
	}
	for i, w := range f.Witnesses {
		switch {
		case w == "" || strings.ContainsAny(w, " /"):
			return inv, fmt.Errorf("witnesses[%d]: %q must be a gossip node name, non-empty, without spaces or /", i, w)
		case nodes[w]:
			return inv, fmt.Errorf("witnesses[%d]: %q is a machine's node (or listed twice): a witness runs on a host that is not a machine Hale heals", i, w)
		}
		nodes[w] = true
		inv.Witnesses = append(inv.Witnesses, w)
	}
	return inv, nil
}

// Validate is the policy pf says: the defaults, with what pf sets checked and taken.
func (pf PolicyFile) Validate() (pass.Policy, error) {
	p := pass.DefaultPolicy()
	p.Quorum.MinFaultTolerance = pf.MinFaultTolerance
	if pf.MaxLearners != nil {
		p.Quorum.MaxLearners = *pf.MaxLearners
	}
	if err := p.Quorum.Validate(); err != nil {
		return p, fmt.Errorf("policy.%w", err)
	}
	for _, l := range []struct {
		field, value string
		dst          *quorum.Limit
	}{{"policy.maxInFlight", pf.MaxInFlight, &p.Quorum.Pools.MaxInFlight}, {"policy.maxUnhealthy", pf.MaxUnhealthy, &p.Quorum.Pools.MaxUnhealthy}} {
		v, ok, err := CheckLimit(l.field, l.value)
		if err != nil {
			return p, err
		}
		if ok {
			*l.dst = v
		}
	}
	timeouts := map[string]time.Duration{}
	for probe, d := range pf.ProbeTimeouts {
		timeouts[probe] = d.Duration
	}
	if err := CheckProbeTimeouts("policy.probeTimeouts", timeouts); err != nil {
		return p, err
	}
	maps.Copy(p.Assess.ProbeTimeouts, timeouts)
	for _, cond := range slices.Sorted(maps.Keys(pf.NodeConditionTimeouts)) {
		d := pf.NodeConditionTimeouts[cond]
		if d.Duration <= 0 {
			return p, fmt.Errorf("policy.nodeConditionTimeouts.%s: %v must be positive", cond, d)
		}
		p.Assess.NodeConditionTimeouts[cond] = d.Duration
	}
	if pf.RateLimit.Max < 0 || pf.RateLimit.Per.Duration < 0 {
		return p, errors.New("policy.rateLimit: max and per must not be negative")
	}
	if pf.RateLimit.Max > 0 {
		p.RateMax = pf.RateLimit.Max
	}
	p.RatePer = pf.RateLimit.Per.Or(p.RatePer)
	for _, d := range []struct {
		field string
		value config.Duration
		dst   *time.Duration
	}{{"deadTimeout", pf.DeadTimeout, &p.Assess.DeadTimeout}, {"etcdUnreachableTimeout", pf.EtcdUnreachableTimeout, &p.Assess.EtcdUnreachableTimeout},
		{"staleAfter", pf.StaleAfter, &p.Assess.StaleAfter}, {"cooldown", pf.Cooldown, &p.Cooldown}, {"flapWindow", pf.FlapWindow, &p.FlapWindow},
		{"comeBackTimeout", pf.ComeBackTimeout, &p.ComeBackTimeout}, {"etcdCatchUp", pf.EtcdCatchUp, &p.Assess.EtcdCatchUp}} {
		if err := CheckWait("policy."+d.field, d.value.Duration, ""); err != nil {
			return p, err
		}
		*d.dst = d.value.Or(*d.dst)
	}
	if err := pf.StallTolerance.apply("stallTolerance", &p.StallTolerance); err != nil {
		return p, err
	}
	if err := pf.ComponentGrace.apply("componentGrace", &p.ComponentGrace); err != nil {
		return p, err
	}
	if pf.MaxAttempts < 0 {
		return p, fmt.Errorf("policy.maxAttempts: %d must not be negative", pf.MaxAttempts)
	}
	if pf.MaxAttempts > 0 {
		p.MaxAttempts = pf.MaxAttempts
	}
	if d := pf.OutOfServiceAfter; d != nil {
		if err := CheckWait("policy.outOfServiceAfter", d.Duration, "never"); err != nil {
			return p, err
		}
		p.OutOfServiceAfter = d.Duration
	}
	p.PlannedWork = PlannedWorkKinds()
	if pf.PlannedWork != nil {
		p.PlannedWork = []string{}
		for i, w := range *pf.PlannedWork {
			if !slices.Contains(PlannedWorkKinds(), w) {
				return p, fmt.Errorf("policy.plannedWork[%d]: %q is no kind of planned work (%s)", i, w, strings.Join(PlannedWorkKinds(), ", "))
			}
			if !slices.Contains(p.PlannedWork, w) {
				p.PlannedWork = append(p.PlannedWork, w)
			}
		}
	}
	return p, nil
}

// Reloader keeps the last good inventory: a bad file on reload is reported and the previous
// inventory stays in force (DESIGN.md rule 7).
type Reloader struct {
	path             string
	machinesRequired bool
	mu               sync.Mutex
	cur              pass.Inventory
}

// NewReloader loads path; the first load must succeed. machinesRequired: see load.
func NewReloader(path string, machinesRequired bool) (*Reloader, error) {
	inv, err := load(path, machinesRequired)
	if err != nil {
		return nil, err
	}
	return &Reloader{path: path, machinesRequired: machinesRequired, cur: inv}, nil
}

// Reload reads the file again; on error the previous inventory is kept and the error returned.
func (r *Reloader) Reload() error {
	inv, err := load(r.path, r.machinesRequired)
	if err != nil {
		return fmt.Errorf("%w; keeping the previous inventory", err)
	}
	r.mu.Lock()
	r.cur = inv
	r.mu.Unlock()
	return nil
}

// Current returns the inventory in force.
func (r *Reloader) Current() pass.Inventory {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur
}
