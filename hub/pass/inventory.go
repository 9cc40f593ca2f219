package pass

import (
	"time"

	"github.com/hale-dev/hale/bmc/bmcval"
	"github.com/hale-dev/hale/hub/assess"
	"github.com/hale-dev/hale/quorum"
)

// Inventory is a validated inventory.
type Inventory struct {
	Cluster  string
	Policy   Policy
	Machines []Machine
	// Witnesses are the node names of the witness agents (see inventory.File).
	Witnesses []string
}

// Policy is the validated policy.
type Policy struct {
	Quorum      quorum.Policy
	Assess      assess.Policy
	RateMax     int
	RatePer     time.Duration
	Cooldown    time.Duration
	MaxAttempts int
	FlapWindow  time.Duration
	// ComeBackTimeout bounds an await-healthy step.
	ComeBackTimeout time.Duration
	// PlannedWork are the kinds of planned work (Kubernetes mode) during which the hub starts nothing
	// on a machine: the inventory's policy.plannedWork (inventory.PlannedWorkKinds; nil: none, while a file
	// that sets none has them all).
	PlannedWork []string
	// OutOfServiceAfter (Kubernetes mode): how long a machine Hale fenced must have been off, its BMC
	// reading it Off, before its Node is tainted node.kubernetes.io/out-of-service (OutOfService; 0:
	// never).
	OutOfServiceAfter time.Duration
	// StallTolerance: how long a machine dead to a majority of the observers must stay so, with no
	// sign of life, before the hub power-cycles, fences or replaces it, unless its BMC proves a hang
	// first (stall.go). ComponentGrace: how long a machine whose agent reports, a component of it
	// failing (its etcd, API server or kubelet), waits for the kubelet's or systemd's restart of that
	// component before the hub acts on it.
	StallTolerance, ComponentGrace PerQuorum
}

// PerQuorum is a wait that depends on whether etcd keeps its quorum without the machine: Held when
// it does (or the machine has no member), Needed when its member is needed for quorum.
type PerQuorum struct {
	Held, Needed time.Duration
}

// For is the wait when the machine's member is needed for quorum (needed) or not.
func (w PerQuorum) For(needed bool) time.Duration {
	if needed {
		return w.Needed
	}
	return w.Held
}

// The defaults of the stall tolerance and the component grace (docs/design.md, "Waiting for proof").
// A dead machine is acted on after 30 s without a sign of life while etcd keeps quorum without it:
// longer than the pauses machines really have (VM stuns and live migrations up to ~10 s, rarely 30;
// corosync's cloud guidance 20–30 s; VMware HA 15 s); 10 s when its member is needed for quorum (the
// cluster is down meanwhile, and etcd's own leader election has long given up on it). A component
// failing on a machine that runs waits 3 min: kubeadm's liveness probes restart a hung etcd or API
// server after 8 failed probes 10 s apart, each waiting up to 15 s, then the 30 s grace period to
// kill it (~2.5 min); 30 s when its member is needed for quorum (a crashed one is restarted in ~10 s).
const (
	DefaultStallTolerance       = 30 * time.Second
	DefaultStallToleranceNeeded = 10 * time.Second
	DefaultComponentGrace       = 3 * time.Minute
	DefaultComponentGraceNeeded = 30 * time.Second
)

// DefaultPolicy is the policy of an inventory that sets none.
func DefaultPolicy() Policy {
	return Policy{Quorum: quorum.DefaultPolicy(), Assess: assess.DefaultPolicy(), RateMax: 3, RatePer: 10 * time.Minute,
		Cooldown: 5 * time.Minute, MaxAttempts: 3, FlapWindow: time.Hour, ComeBackTimeout: 10 * time.Minute,
		OutOfServiceAfter: time.Minute,
		StallTolerance:    PerQuorum{Held: DefaultStallTolerance, Needed: DefaultStallToleranceNeeded},
		ComponentGrace:    PerQuorum{Held: DefaultComponentGrace, Needed: DefaultComponentGraceNeeded}}
}

// Machine is a validated inventory machine.
type Machine struct {
	assess.MachineRef
	Class    string
	Strategy quorum.Strategy
	Pool     string
	Endpoint bmcval.Endpoint
	// Credentials, CAFile, Insecure: how to log in to the BMC.
	Credentials bmcval.Credentials
	CAFile      string
	Insecure    bool
	// Replace is what the machine's owner allows when Strategy is Replace (Kubernetes mode).
	Replace quorum.ReplaceOptions
	// Hold, when set, says why the hub must not act on this machine at all (a BareMetalHost detached
	// or paused, no way to heal it): it is watched and explained, never remediated.
	Hold string
	// PlannedWork, when set, says what planned work is under way on the machine (its Node cordoned,
	// its owner rolling out, a NodeMaintenance): the hub starts nothing on it meanwhile; an operator's
	// reboot may. Its evidence counts as ever: a machine that dies under maintenance costs etcd a vote.
	PlannedWork string
	// CheckedBy, when set, names the health checker that judges the machine and hands its
	// remediations to Hale (a MachineHealthCheck whose templateRef is a HaleRemediationTemplate): the
	// hub starts none of its own on it and carries out that checker's requests, as an operator's.
	CheckedBy string
}

// Machine is the inventory's machine of that name.
func (inv Inventory) Machine(name string) (Machine, bool) {
	for i := range inv.Machines {
		m := &inv.Machines[i]
		if m.Name == name {
			return *m, true
		}
	}
	return Machine{}, false
}

// MachineOfMember is the inventory's machine whose etcd member is member.
func (inv Inventory) MachineOfMember(member string) (Machine, bool) {
	for i := range inv.Machines {
		m := &inv.Machines[i]
		if m.Member != "" && m.Member == member {
			return *m, true
		}
	}
	return Machine{}, false
}

// MachineOfNode is the inventory's machine whose Node is node.
func (inv Inventory) MachineOfNode(node string) (Machine, bool) {
	for i := range inv.Machines {
		m := &inv.Machines[i]
		if m.Node != "" && m.Node == node {
			return *m, true
		}
	}
	return Machine{}, false
}

// BMCReadiness is what the last readiness check of a machine's BMC found.
type BMCReadiness struct {
	Checked time.Time `json:"checked"`
	Ready   bool      `json:"ready"`
	// Problem names what is wrong, in one word (bmcval.Problem's, or ProblemConfig).
	Problem bmcval.Problem    `json:"problem,omitempty"`
	Power   bmcval.PowerState `json:"power,omitempty"`
	// Health is the system's health roll-up the check read (Redfish's Status.Health; empty when the
	// BMC does not say), and HealthSince when the hub first read it so after reading it otherwise
	// (zero: not known to have changed): a Critical health proves a hang only when it turned so.
	Health      string    `json:"health,omitempty"`
	HealthSince time.Time `json:"healthSince,omitzero"`
	// Hangs are the entries of the system's event log that record a hang (bmcval.Evidence), and
	// LogError why the log could not be read.
	Hangs    []bmcval.LogEntry `json:"hangs,omitempty"`
	LogError string            `json:"logError,omitempty"`
	// Error is the failed call's error, in one line that names the BMC.
	Error string `json:"error,omitempty"`
}

// ProblemConfig: the hub cannot talk to the BMC as configured (ipmitool missing, an unreadable CA
// bundle): nothing was sent.
const ProblemConfig bmcval.Problem = "Config"

// Refs are the machines as the assessor knows them, in the inventory's order.
func (inv Inventory) Refs() []assess.MachineRef {
	out := make([]assess.MachineRef, len(inv.Machines))
	for i := range inv.Machines {
		m := &inv.Machines[i]
		out[i] = m.MachineRef
	}
	return out
}
